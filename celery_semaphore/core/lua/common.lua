-- common.lua: prepended to every script of this folder (see celery_semaphore/core/scripts.py).
--
-- KEYS (the same eight, in this order, for every script; one hash tag per semaphore):
--   KEYS[1] holders  ZSET  holder -> lease expiry, ms of server time
--   KEYS[2] hinfo    HASH  holder -> "<fencing token>|<acquired ms>|<info>"
--   KEYS[3] waiters  ZSET  holder -> ticket (place in line; lower goes first)
--   KEYS[4] wexp     ZSET  holder -> waiter lease expiry, ms of server time
--   KEYS[5] winfo    HASH  holder -> "<first ask ms>|<info>"
--   KEYS[6] meta     HASH  limit (declared), override, draining, fence, ticket, hold_ms,
--                          released, handover, family, and the m_* counters metrics.py
--                          exports
--   KEYS[7] parked   HASH  holder -> "<handover token>|<state>|<released>|<payload>":
--                          a waiter that left its payload to be handed over when due
--                          (state p: parked, h: handed over, d: arrived; see dispatch()),
--                          or one waiting in place (state w; see grant_in_place())
--   KEYS[8] handed   ZSET  holder -> when to hand it over again (h), or forget it (d)
--   KEYS[9] sent     ZSET  holder -> when its task was published with a place in line
--                          (enqueue.lua), until it first asks or is released: so a task
--                          whose place lapsed while its message sat in the broker is
--                          still seen (status.lua); entries older than the sent horizon
--                          (an hour, at most the idle time) are dropped: a message the
--                          broker lost is not counted forever
--
-- Tickets and fencing tokens are max(last + 1, server time in µs): strictly
-- increasing even after the meta hash expired or Redis lost its data.
--
-- holders and hinfo hold the same members, and so do waiters, wexp and winfo:
-- each group is written and deleted together by one script, and touch() gives
-- all six keys the same expiry. So ZCARD waiters == 0 means that wexp and winfo
-- are absent too, which lets the hot paths skip the waiter keys entirely.

local holders, hinfo, waiters, wexp, winfo, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local parked, handed, sent = KEYS[7], KEYS[8], KEYS[9]
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)
local BATCH = 1000

local function fmt(n)
  return string.format('%.0f', n)
end

-- The next fence or ticket after ``last`` (a meta field's value, or nil); the
-- caller stores it (acquire batches its meta writes into one HSET).
local function seq_after(last)
  return math.max((tonumber(last) or 0) + 1, now_us)
end

local function next_seq(field)
  local value = seq_after(redis.call('HGET', meta, field))
  redis.call('HSET', meta, field, fmt(value))
  return value
end

-- Histogram bucket bounds in ms; celery_semaphore/metrics.py has the same in seconds.
local BUCKETS = {5, 25, 100, 250, 1000, 2500, 10000, 30000, 60000, 300000, 1800000}

local function bump(field, n)
  if n > 0 then redis.call('HINCRBY', meta, field, n) end
end

-- How many waiters are parked (state p) and handed over (h), kept in meta so
-- status() and the metrics read them without scanning ``parked``.
local COUNTED = {p = 'n_parked', h = 'n_handed'}

local function state_in(record)
  return record and string.match(record, '^%d+|(%a)|') or nil
end

local function recount(before, after)
  if before == after then return end
  if COUNTED[before] then redis.call('HINCRBY', meta, COUNTED[before], -1) end
  if COUNTED[after] then redis.call('HINCRBY', meta, COUNTED[after], 1) end
end

-- Sets ``holder``'s parked record to ``record`` (nil: deletes it); ``old``: the
-- record it replaces (false or nil: none). Every write to ``parked`` goes here.
local function put_record(holder, record, old)
  if record then
    redis.call('HSET', parked, holder, record)
  else
    redis.call('HDEL', parked, holder)
  end
  recount(state_in(old), state_in(record))
end

-- One observation of ``ms`` in histogram ``kind`` ('wait' or 'hold'): buckets
-- m_<kind>_b<i> are not cumulative; metrics.py adds them up.
local function observe(kind, ms)
  local index = #BUCKETS
  for i, bound in ipairs(BUCKETS) do
    if ms <= bound then
      index = i - 1
      break
    end
  end
  redis.call('HINCRBY', meta, 'm_' .. kind .. '_b' .. index, 1)
  redis.call('HINCRBY', meta, 'm_' .. kind .. '_sum', math.floor(ms))
end

local function token_of(record)
  if not record then return nil end
  return string.match(record, '^(%d+)|')
end

-- Drops holders and waiters whose leases ran out; returns how many went, and
-- how many of those were waiters. ``waiting``: ZCARD waiters if the caller read
-- it, else nil; 0 skips the scan of wexp (no waiters, so none lapsed).
local function reclaim(waiting)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms, 'LIMIT', 0, BATCH)
  if #gone > 0 then
    redis.call('ZREM', holders, unpack(gone))
    redis.call('HDEL', hinfo, unpack(gone))
    bump('m_expired', #gone)
    bump('released', #gone)
  end
  local lapsed = 0
  if waiting ~= 0 then
    local list = redis.call('ZRANGEBYSCORE', wexp, '-inf', now_ms, 'LIMIT', 0, BATCH)
    if #list > 0 then
      redis.call('ZREM', waiters, unpack(list))
      redis.call('ZREM', wexp, unpack(list))
      redis.call('HDEL', winfo, unpack(list))
      for _, record in ipairs(redis.call('HMGET', parked, unpack(list))) do
        recount(state_in(record), nil)
      end
      redis.call('HDEL', parked, unpack(list))
      redis.call('ZREM', handed, unpack(list))
    end
    lapsed = #list
  end
  return #gone + lapsed, lapsed
end

-- Tells blocked waiters that permits are free, with the highest ticket that
-- may now be admitted ('inf': any), so waiters further back sleep on.
-- Publishes nothing when nobody waits or no permit is free.
local function wake(channel)
  if redis.call('ZCARD', waiters) == 0 then return end
  local m = redis.call('HMGET', meta, 'limit', 'override', 'draining')
  if m[3] == '1' then return end
  local free = (tonumber(m[2]) or tonumber(m[1]) or 0) - redis.call('ZCARD', holders)
  if free <= 0 then return end
  local last = redis.call('ZRANGE', waiters, free - 1, free - 1, 'WITHSCORES')
  redis.call('PUBLISH', channel, last[2] or 'inf')
end

-- Restarts the idle expiry of every key. ``no_waiters``: the caller knows the
-- waiter keys are absent (PEXPIRE would do nothing on them), so it skips them;
-- parked and handed are touched only where they exist.
local function touch(idle_ms, no_waiters)
  for i = 1, 6 do
    if not (no_waiters and i >= 3 and i <= 5) then
      redis.call('PEXPIRE', KEYS[i], idle_ms)
    end
  end
  if redis.call('HLEN', parked) > 0 then
    redis.call('PEXPIRE', parked, idle_ms)
    redis.call('PEXPIRE', handed, idle_ms)
  end
end

-- Parked waiters ------------------------------------------------------------
--
-- A waiter may leave a payload (a message that brings it back) and stop asking:
-- it is parked. dispatch() hands parked waiters over when they are due: it marks
-- them handed (with a new handover token and a deadline) and returns their
-- payloads for the caller to publish. A waiter is due when
--   * it is among the first ``free`` waiters (a permit is free for it now), or
--   * it is among the next ``window`` waiters and parked before the latest
--     release: its turn is near, so it should be waiting at a worker when it
--     comes (the window is the number of waiters served within max_block at
--     the average hold time, at most the limit);
-- or it was handed over and did not arrive by its deadline (its publisher
-- may have died): handed over again, with a new token, so the stale copy is
-- recognised when it arrives (acquire.lua answers "duplicate"); or it parked
-- with a time by which it must come back (its wait budget), and that passed.
-- Records of arrived waiters (state d) and of waiters served by another copy
-- of their task (state x) stay as tombstones for TOMBSTONE_MS.

local TOMBSTONE_MS = 3600000
local PARKED_RECORD = '^(%d+)|(%a)|(%d+)|(.*)$'

local function hand_over(holder, record, payload, deadline_ms, out)
  local token = next_seq('handover')
  put_record(holder, fmt(token) .. '|h|0|' .. payload, record)
  redis.call('ZADD', handed, now_ms + deadline_ms, holder)
  out[#out + 1] = holder
  out[#out + 1] = fmt(token)
  out[#out + 1] = payload
end

-- ``cfg``: '' when the caller does not publish (nothing is handed over), else
-- "<max block ms>|<deadline ms>". Returns {holder, token, payload, ...}.
local function dispatch(cfg)
  local out = {}
  if cfg == '' or redis.call('HLEN', parked) == 0 then return out end
  local max_block_ms, deadline_ms = string.match(cfg, '^(%d+)|(%d+)$')
  max_block_ms, deadline_ms = tonumber(max_block_ms), tonumber(deadline_ms)
  local m = redis.call('HMGET', meta, 'limit', 'override', 'draining', 'released', 'hold_ms')
  local limit = tonumber(m[2]) or tonumber(m[1]) or 0
  local free = 0
  if m[3] ~= '1' then free = math.max(0, limit - redis.call('ZCARD', holders)) end
  local released, hold_ms = tonumber(m[4]) or 0, tonumber(m[5]) or 0
  local window = limit
  if hold_ms > 0 then window = math.min(limit, math.floor(max_block_ms * limit / hold_ms)) end
  if m[3] == '1' then window = 0 end
  if free + window > 0 then
    local first = redis.call('ZRANGE', waiters, 0, free + window - 1)
    for i, holder in ipairs(first) do
      local record = redis.call('HGET', parked, holder)
      if record then
        local _, state, mark, payload = string.match(record, PARKED_RECORD)
        if state == 'p' and (i <= free or tonumber(mark) < released) then
          hand_over(holder, record, payload, deadline_ms, out)
        end
      end
    end
  end
  local late = redis.call('ZRANGEBYSCORE', handed, '-inf', now_ms, 'LIMIT', 0, BATCH)
  for _, holder in ipairs(late) do
    local record = redis.call('HGET', parked, holder)
    local _, state, _, payload = string.match(record or '', PARKED_RECORD)
    if (state == 'h' or state == 'p') and redis.call('ZSCORE', waiters, holder) then
      if state == 'h' then bump('m_handover_retried', 1) end
      hand_over(holder, record, payload, deadline_ms, out)
    else
      redis.call('ZREM', handed, holder)
      put_record(holder, nil, record)
    end
  end
  bump('m_handed_over', #out / 3)
  return out
end

-- What a waiter presenting handover ``token`` is: 'valid' (the copy handed over
-- last: its record becomes a tombstone), 'again' (that copy delivered again, or
-- no record: proceed as usual), or 'stale' (an older copy: drop it).
local function arrival(holder, token)
  local record = redis.call('HGET', parked, holder)
  if not record then return 'again' end
  local current, state = string.match(record, PARKED_RECORD)
  if current ~= token or state == 'x' then return 'stale' end
  if state == 'd' or state == 'w' then return 'again' end
  put_record(holder, token .. '|d|0|', record)
  redis.call('ZADD', handed, now_ms + TOMBSTONE_MS, holder)
  return 'valid'
end

-- Forget a waiter's parked record (it left the line); ``old``: the record, if
-- the caller read it.
local function unpark(holder, old)
  if old == nil then old = redis.call('HGET', parked, holder) end
  put_record(holder, nil, old)
  redis.call('ZREM', handed, holder)
end

-- Waiting in place -----------------------------------------------------------
--
-- A waiter blocked on the wake channel (wait_for_turn, after SUBSCRIBE) is
-- marked w in parked, with the lease it asks for ("<token>|w|<lease ms>|"): a
-- release then grants it the permit itself and PUBLISHes
-- "g|<holder>|<fencing token>|<lease expiry ms>|<waited ms>", so the next owner
-- starts without another round trip. The mark keeps the handover token of an
-- arrived waiter (state d), and goes back to d (or away) when the waiter stops
-- waiting in place.

local function mark_in_place(holder, lease_ms)
  local record = redis.call('HGET', parked, holder)
  local token, state = '0', nil
  if record then token, state = string.match(record, '^(%d+)|(%a)|') end
  if state == nil or state == 'd' or state == 'w' then
    put_record(holder, token .. '|w|' .. fmt(lease_ms) .. '|', record)
  end
end

-- ``holder`` (whose parked record is ``record``) no longer waits in place.
local function unmark_in_place(holder, record)
  local token, state = string.match(record or '', '^(%d+)|(%a)|')
  if state ~= 'w' then return end
  if token == '0' then
    unpark(holder, record)
  else
    put_record(holder, token .. '|d|0|', record)
  end
end

-- The moving average of the time between grants while others wait, after a grant
-- now (``last_at``: meta.grant_at, ``average``: meta.grant_gap_ms, or nil).
local function paced(last_at, average)
  if not last_at then return average end
  local gap = now_ms - tonumber(last_at)
  return average and (0.8 * tonumber(average) + 0.2 * gap) or gap
end

-- Grants free permits to the first waiters in line while they wait in place
-- (stopping at the first that does not: FIFO), telling each on ``channel``.
-- ``declared``: the limit the caller declares (as an acquire does; the override
-- wins), or nil for a caller that declares none (the recorded one then).
local function grant_in_place(channel, declared)
  local m = redis.call('HMGET', meta, 'limit', 'override', 'draining', 'fence', 'grant_at',
    'grant_gap_ms')
  if m[3] == '1' then return end
  local limit = tonumber(m[2]) or tonumber(declared) or tonumber(m[1]) or 0
  local free = limit - redis.call('ZCARD', holders)
  if free <= 0 then return end
  local fence, last_at, average, granted = m[4], m[5], m[6], 0
  for _, holder in ipairs(redis.call('ZRANGE', waiters, 0, free - 1)) do
    local record = redis.call('HGET', parked, holder)
    local state, lease_ms = string.match(record or '', '^%d+|(%a)|(%d+)|')
    if state ~= 'w' then break end
    local since, info = string.match(redis.call('HGET', winfo, holder) or '', '^(%d+)|(.*)$')
    local waited = now_ms - (tonumber(since) or now_ms)
    local expires = now_ms + tonumber(lease_ms)
    fence = fmt(seq_after(fence))
    redis.call('ZREM', waiters, holder)
    redis.call('ZREM', wexp, holder)
    redis.call('HDEL', winfo, holder)
    unmark_in_place(holder, record)
    redis.call('ZADD', holders, expires, holder)
    redis.call('HSET', hinfo, holder, fence .. '|' .. fmt(now_ms) .. '|' .. (info or ''))
    observe('wait', waited)
    average, last_at = paced(last_at, average), now_ms
    redis.call('PUBLISH', channel,
      'g|' .. holder .. '|' .. fence .. '|' .. fmt(expires) .. '|' .. fmt(waited))
    granted = granted + 1
  end
  if granted > 0 then
    redis.call('HSET', meta, 'fence', fence, 'grant_at', fmt(now_ms), 'grant_gap_ms', fmt(average))
    bump('m_granted', granted)
  end
end

-- A waiter was served by a copy of its task other than the one handed over
-- (it came back on its own): a handed-over copy still on its way is stale.
local function served(holder)
  local record = redis.call('HGET', parked, holder)
  if not record then return end
  local token, state = string.match(record, PARKED_RECORD)
  if state == 'h' then
    put_record(holder, token .. '|x|0|', record)
    redis.call('ZADD', handed, now_ms + TOMBSTONE_MS, holder)
  elseif state == 'p' then
    unpark(holder, record)
  else
    unmark_in_place(holder, record)
  end
end

-- Puts ``holder`` in line at ``ticket`` for ``lease_ms``, keeping when it first asked.
local function stand_in_line(holder, ticket, lease_ms, info)
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('ZADD', wexp, now_ms + lease_ms, holder)
  if redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info) == 0 then
    local first = string.match(redis.call('HGET', winfo, holder), '^(%d+)|') or fmt(now_ms)
    redis.call('HSET', winfo, holder, first .. '|' .. info)
  end
end

local function earliest_expiry()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end
