-- common_weights.lua, of the prelude (see common_keys.lua): holders and their records,
-- and the weights of holders and waiters.
--
-- Weights ------------------------------------------------------------------------
--
-- A contender may ask for k permits and j of the rate's grants at once (its weight:
-- "<k>|<j>"; 1|1 unless said). A holder of k > 1 permits is k members of holders:
-- itself and its seats "<holder>\0<2..k>" (holder ids never contain \0), all with its
-- lease expiry, so ZCARD holders counts the permits in use and reclaim() frees all k
-- at once; its hinfo record says k ("/<k>" after the acquired ms). A waiter whose
-- weight is not 1|1 has meta "w|<waiter>" = "<k>|<j>" while it is in line
-- (stand_in_line(), leave_line()); meta.n_weighted counts those, so the line's weights
-- are read only while one is in it.
-- A waiter is granted when the permits and grants of those ahead and its own fit in the
-- free permits and in the rate's room: FIFO, so a heavy waiter at the head holds back
-- those behind it until its k permits are free (fit()).

local SEAT = '\0'

-- "<k>|<j>[|...]" (or '') as permits, grants.
local function weight_in(text)
  local k, j = string.match(text or '', '^(%d+)|(%d+)')
  return tonumber(k) or 1, tonumber(j) or 1
end

-- A weight text's priority (0 unless said), fair weight and fair key (nil: not fair);
-- see "The order of the line".
local function order_in(text)
  local priority, fair_weight, key = string.match(text or '', '^%d+|%d+|(%-?%d+)|(%d+)|(.*)$')
  if priority then return tonumber(priority), tonumber(fair_weight), key end
  priority = string.match(text or '', '^%d+|%d+|(%-?%d+)$')
  return tonumber(priority) or 0, 1, nil
end

-- Holders ------------------------------------------------------------------------

-- The token a holder's hinfo record (or a parked record) starts with, or nil.
local function token_of(record)
  if not record then return nil end
  return string.match(record, '^(%d+)|')
end

-- When the first lease runs out, ms (0: nobody holds a permit).
local function earliest_expiry()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end

-- ``holder``'s seats beyond its own member: {holder\02, ..., holder\0k}.
local function seats(holder, k)
  local list = {}
  for i = 2, k do list[#list + 1] = holder .. SEAT .. i end
  return list
end

-- The permits a holder whose hinfo record is ``record`` holds (1 unless more).
local function held_weight(record)
  return tonumber(string.match(record or '', '^%d+|%d+/(%d+)|')) or 1
end

-- A holder's hinfo record (see KEYS[2]).
local function holder_record(token, acquired, k, info)
  local weight = k > 1 and '/' .. fmt(k) or ''
  return token .. '|' .. acquired .. weight .. '|' .. info
end

-- ``holder`` holds ``k`` permits until ``expires`` (its hinfo record is the
-- caller's); ``xx``: only extends those it holds.
local function occupy(holder, expires, k, xx)
  local args = {expires, holder}
  for _, seat in ipairs(seats(holder, k)) do
    args[#args + 1] = expires
    args[#args + 1] = seat
  end
  if xx then
    redis.call('ZADD', holders, 'XX', unpack(args))
  else
    redis.call('ZADD', holders, unpack(args))
  end
end

-- Takes away the seats of ``holder``, which held ``k`` permits; its own member and
-- its hinfo record are the caller's.
local function vacate(holder, k)
  if k > 1 then redis.call('ZREM', holders, unpack(seats(holder, k))) end
end

-- Waiters' weights ---------------------------------------------------------------

-- Whether a weighted waiter may be in line: ``m`` with n_weighted loaded says
-- (without it, or without ``m``, maybe).
local function any_weighted(m)
  local n = m and rawget(m, 'n_weighted')
  return n == nil or (tonumber(n) or 0) > 0
end

local function count_weighted(m, delta)
  local n = redis.call('HINCRBY', meta, 'n_weighted', delta)
  if m then m.n_weighted = fmt(n) end
end

-- The weights of the waiters in ``list``: {permits}, {grants}, {their weight texts, or
-- false}, in order.
local function weights_of(m, list)
  local ks, js = {}, {}
  local values = {}
  if #list > 0 and any_weighted(m) then
    local fields = {}
    for i, waiter in ipairs(list) do fields[i] = 'w|' .. waiter end
    values = records_of(fields)
  end
  for i = 1, #list do ks[i], js[i] = weight_in(values[i]) end
  return ks, js, values
end

-- How many of the waiters ``list`` (in line order) fit in ``permits`` and ``room``
-- from the head on.
local function fit(m, list, permits, room)
  local ks, js = weights_of(m, list)
  local n, k, j = 0, 0, 0
  for i = 1, #list do
    if k + ks[i] > permits or j + js[i] > room then break end
    n, k, j = i, k + ks[i], j + js[i]
  end
  return n
end

-- The permits and grants the first ``ahead`` waiters in line ask for (past BATCH of
-- them, one each for the rest).
local function weight_ahead(m, ahead)
  if ahead == 0 or not any_weighted(m) then return ahead, ahead end
  local n = math.min(ahead, BATCH)
  local ks, js = weights_of(m, redis.call('ZRANGE', waiters, 0, n - 1))
  local k, j = ahead - n, ahead - n
  for i = 1, n do k, j = k + ks[i], j + js[i] end
  return k, j
end
