-- common_line.lua, of the prelude (see common_keys.lua): standing in line and leaving it
-- (KEYS[3..5], and a waiter's records: its weight in meta, its parked record), and
-- reclaim().

-- Waiters' weight records -----------------------------------------------------------

-- Drops the weight records of the waiters in ``list``, who left the line (and counts
-- them out of their fair keys).
local function unweigh(m, list)
  if not any_weighted(m) then return end
  local fields = {}
  for i, waiter in ipairs(list) do fields[i] = 'w|' .. waiter end
  local unweighed = 0
  for _, record in ipairs(records_of(fields)) do
    if record then
      unweighed = unweighed + 1
      local _, _, key = order_in(record)
      if key then count_fair(key, -1) end
    end
  end
  if unweighed > 0 then
    redis.call('HDEL', meta, unpack(fields))
    count_weighted(m, -unweighed)
  end
end

-- Records ``waiter``'s weight text (see "Weights" and "The order of the line"; nil:
-- leaves it as it is) while it is in line.
local function weigh_waiter(m, waiter, weight)
  if weight == nil then return end
  if weight ~= '' and weight ~= '1|1' then
    local old = records_of({'w|' .. waiter})[1]
    if old == weight then return end
    if old then unweigh(m, {waiter}) end
    redis.call('HSET', meta, 'w|' .. waiter, weight)
    count_weighted(m, 1)
    local _, _, key = order_in(weight)
    if key then count_fair(key, 1) end
  elseif any_weighted(m) then
    unweigh(m, {waiter})
  end
end

-- The line -----------------------------------------------------------------------

-- Takes the holders in ``list`` out of the line; returns how many were in it.
-- ``m``: with n_weighted loaded, or nil. ``fate`` of their parked records: 'forget'
-- (they are gone), 'served' (they hold a permit now: see served()), or nil (left as
-- they are: an arrival made a tombstone).
local function leave_line(list, fate, m)
  local left = redis.call('ZREM', waiters, unpack(list))
  redis.call('ZREM', wexp, unpack(list))
  redis.call('HDEL', winfo, unpack(list))
  if left > 0 then unweigh(m, list) end
  if fate == 'forget' then
    forget(list)
  elseif fate == 'served' then
    for _, holder in ipairs(list) do served(holder) end
  end
  return left
end

-- Puts ``holder`` in line at ``ticket`` for ``lease_ms``, keeping when it first asked;
-- ``weight``: "<k>|<j>", or nil to keep the one recorded; ``m``: with n_weighted loaded.
-- The first waiter of an empty line publishes 'k' on ``channel``: the processes that
-- keep permits give them back (see "Kept permits" in release.lua).
local function stand_in_line(m, holder, ticket, lease_ms, info, weight, channel)
  if redis.call('ZCARD', waiters) == 0 then redis.call('PUBLISH', channel, 'k') end
  weigh_waiter(m, holder, weight)
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('ZADD', wexp, now_ms + lease_ms, holder)
  if redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info) == 0 then
    local first = string.match(redis.call('HGET', winfo, holder), '^(%d+)|') or fmt(now_ms)
    redis.call('HSET', winfo, holder, first .. '|' .. info)
  end
end

-- Drops holders and waiters whose leases ran out; returns how many went, and
-- how many of those were waiters. ``waiting``: ZCARD waiters if the caller read
-- it, else nil; 0 skips the scan of wexp (no waiters, so none lapsed).
local function reclaim(m, waiting)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now_text, 'LIMIT', '0', BATCH_TEXT)
  if #gone > 0 then
    redis.call('ZREM', holders, unpack(gone))
    redis.call('HDEL', hinfo, unpack(gone))
    bump('m_expired', #gone)
    count_released(m, #gone)
  end
  local lapsed = 0
  if waiting ~= 0 then
    local list = redis.call('ZRANGEBYSCORE', wexp, '-inf', now_text, 'LIMIT', '0', BATCH_TEXT)
    if #list > 0 then leave_line(list, 'forget', m) end
    lapsed = #list
  end
  return #gone + lapsed, lapsed
end
