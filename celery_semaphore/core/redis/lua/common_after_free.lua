-- common_after_free.lua, of the prelude (see common_keys.lua): what follows freed
-- capacity, after_free().
--
-- What follows freed capacity (a released permit, a reclaimed lease or waiter, a
-- waiter leaving the line, a raised limit, an ended drain), after_free(): free
-- permits go to the waiters in place at the head of the line (FIFO: up to the first
-- one that is not), the others are woken, the parked waiters now due are handed
-- over. Every script that frees anything calls it; enqueue hands over nothing unless
-- it parks (a publisher calls it inside before_task_publish; the next release or
-- heartbeat does).

-- Tells blocked waiters that permits are free, with the highest ticket that
-- may now be admitted ('inf': any), so waiters further back sleep on.
-- Publishes nothing when nobody waits or no permit is free.
local function wake(m, declared, channel)
  if paused(m) then return end
  local waiting = redis.call('ZCARD', waiters)
  if waiting == 0 then return end
  local permits = line_limit(m, declared) - redis.call('ZCARD', holders)
  local room = line_room(m)
  local free = math.min(permits, room, waiting + 1)
  if permits == math.huge then free = math.min(free, BATCH) end  -- no limit binds
  if free <= 0 then return end
  if not any_weighted(m) then
    local last = redis.call('ZRANGE', waiters, free - 1, free - 1, 'WITHSCORES')
    redis.call('PUBLISH', channel, last[2] or 'inf')
    return
  end
  local first = redis.call('ZRANGE', waiters, 0, free - 1, 'WITHSCORES')
  local list = {}
  for i = 1, #first, 2 do list[#list + 1] = first[i] end
  local n = fit(m, list, permits, room)
  if n == 0 then return end  -- the head waits for more permits than are free
  redis.call('PUBLISH', channel, n == #list and #list < free and 'inf' or first[2 * n])
end

-- The moving average of the time between grants while others wait, after a grant
-- now (``last_at``: meta.grant_at, ``average``: meta.grant_gap_ms, or nil).
local function paced(last_at, average)
  if not last_at then return average end
  local gap = now_ms - tonumber(last_at)
  return average and (0.8 * tonumber(average) + 0.2 * gap) or gap
end

-- Waiting in place: a waiter blocked on the wake channel (wait_for_turn, after
-- SUBSCRIBE) is marked w with the lease it asks for. Free permits go to the first
-- waiters in line while they wait in place, each told on ``channel`` with
-- "g|<holder>|<fencing token>|<lease expiry ms>|<waited ms>", so the next owner
-- starts without another round trip.
local function grant_in_place(m, declared, channel)
  if paused(m) then return end
  local permits = effective_limit(m, declared) - redis.call('ZCARD', holders)
  local room = rate_room(m)
  local fence, last_at, average, granted = m.fence, m.grant_at, m.grant_gap_ms, 0
  local spent = 0
  local more = true
  -- The line's head, GRANT_CHUNK waiters at a time (those served leave it): a long
  -- line of tasks that are not waiting in place costs one short read, not its length.
  while more and math.min(permits, room) > 0 do
    local want = math.min(permits, room, GRANT_CHUNK)
    local list = redis.call('ZRANGE', waiters, 0, want - 1)
    local n = #list
    local ks, js, records = {}, {}, {}
    if any_weighted(m) then
      n = fit(m, list, permits, room)
      ks, js, records = weights_of(m, list)
    end
    more = n == want  -- else the line ended, or its next waiter asks for more than is free
    for i = 1, n do
      local holder = list[i]
      local _, state, lease_ms = parked_in(redis.call('HGET', parked, holder))
      if state ~= 'w' then
        more = false
        break
      end
      local since, info = string.match(redis.call('HGET', winfo, holder) or '', '^(%d+)|(.*)$')
      local waited = now_ms - (tonumber(since) or now_ms)
      local expires = now_ms + tonumber(lease_ms)
      fence = fmt(seq_after(fence))
      if records[i] then count_fair_grant(records[i]) end
      leave_line({holder}, 'served', m)
      occupy(holder, expires, ks[i] or 1)
      permits, room = permits - (ks[i] or 1), room - (js[i] or 1)
      spent = spent + (js[i] or 1)
      redis.call('HSET', hinfo, holder, holder_record(fence, fmt(now_ms), ks[i] or 1, info or ''))
      observe('wait', waited)
      average, last_at = paced(last_at, average), now_ms
      redis.call('PUBLISH', channel,
        'g|' .. holder .. '|' .. fence .. '|' .. fmt(expires) .. '|' .. fmt(waited))
      granted = granted + 1
    end
  end
  if granted > 0 then
    local writes = {'fence', fence, 'grant_at', fmt(now_ms)}
    if average then  -- none yet after the first grant ever
      writes[#writes + 1] = 'grant_gap_ms'
      writes[#writes + 1] = fmt(average)
    end
    spend_rate(m, spent, writes)
    write_meta(m, writes)
    bump('m_granted', granted)
  end
end

-- ``previous``: the token of the copy handed over before, when handed over again
-- (kept as the mark: that copy may only be late; claim.lua gives it back), else '0'.
local function hand_over(m, holder, record, payload, deadline_ms, out, delay_ms, previous)
  local token = fmt(seq_after(m.handover))
  m.handover = token  -- dispatch() writes it to meta once
  put_record(holder, token .. '|h|' .. previous .. '|' .. payload, record)
  redis.call('ZADD', handed, now_ms + delay_ms + deadline_ms, holder)
  out[#out + 1] = holder
  out[#out + 1] = token
  out[#out + 1] = payload
  out[#out + 1] = fmt(delay_ms)
end

-- Hands over the parked waiters that are due: ``cfg`` is '' when the caller does
-- not publish (nothing is handed over), else "<max block ms>|<deadline ms>|<rate lead ms>".
-- Returns {holder, token, payload, delay ms, ...}. A waiter is due when
--   * it is among the first ``free`` waiters (a permit is free for it now), or
--   * it is among the next ``window`` waiters and parked before the latest
--     release: its turn is near, so it should be waiting at a worker when it
--     comes (the window is the number of waiters served within max_block at
--     the average hold time, at most the limit);
-- and, under a rate, it is among the first the rate allows now (``free`` counts
-- no more), or its slot (slot_in()) is within the rate's window (the rate lead, or
-- three intervals if longer; at most max_block): it waits in place for it. (Only
-- the limits that bind count: line_limit(), line_room(). At most the first BATCH
-- waiters are looked at in one call.) The
-- first waiter past that, if parked, is handed over with a delay that
-- brings it to a worker at its slot (at most the deadline ahead), so a slow rate
-- or a paused one needs nobody to ask again; one such waiter at a time.
-- Also due: a waiter handed over that did not arrive by its deadline (its
-- publisher may have died): handed over again, with a new token, so the stale
-- copy is recognised when it arrives (acquire.lua answers code 2; the token before
-- is kept as the mark: see claim.lua); or one that
-- parked with a time by which it must come back (its wait budget), and that passed.
local function dispatch(m, declared, cfg)
  local out = {}
  if cfg == '' or redis.call('HLEN', parked) == 0 then return out end
  local max_block_ms, deadline_ms, lead_ms = string.match(cfg, '^(%d+)|(%d+)|(%d+)$')
  max_block_ms, deadline_ms, lead_ms = tonumber(max_block_ms), tonumber(deadline_ms), tonumber(lead_ms)
  local limit = line_limit(m, declared)
  local free, window = 0, 0
  if not paused(m) then
    free = math.max(0, limit - redis.call('ZCARD', holders))
    window = limit
  end
  local released, hold_ms = tonumber(m.released) or 0, tonumber(m.hold_ms) or 0
  if hold_ms > 0 and limit < math.huge then
    window = math.min(window, math.floor(max_block_ms * limit / hold_ms))
  end
  local room, next_us = line_room(m)
  local rate = room < math.huge and effective_rate(m)
  -- A RateLimited pause hands over nobody for the window: the task that raised
  -- comes back first, to free worker processes; only the timed one (below).
  local rate_paused = rate and (tonumber(m.rate_pause) or 0) > now_ms
  local permits = free
  free = math.min(free, room)
  local count = free + window
  local rate_window_ms = max_block_ms
  if rate then
    rate_window_ms = math.min(max_block_ms, math.max(lead_ms, 3 * rate.interval / 1000))
    count = math.min(count, room + math.floor(rate_window_ms * 1000 / rate.interval) + 2)
  end
  count = math.min(count, BATCH)  -- at most a batch a call (nothing may bind: shadow limits)
  if count > 0 then
    local first = redis.call('ZRANGE', waiters, 0, count - 1)
    local ks, js = weights_of(m, first)
    local k, j = 0, 0  -- the permits and grants asked for up to this waiter (weights)
    for i, holder in ipairs(first) do
      k, j = k + ks[i], j + js[i]
      local record = redis.call('HGET', parked, holder)
      local _, state, mark, payload = parked_in(record)
      local progress = state == 'p' and tonumber(mark) < released
      local near = state == 'p' and ((k <= permits and j <= room) or progress)
      local slot_ms = rate and math.ceil(slot_in(m, room, next_us, j) / 1000) or 0
      if slot_ms > rate_window_ms or rate_paused then
        if state == 'p' and (k <= permits or progress) and slot_ms <= deadline_ms then
          hand_over(m, holder, record, payload, deadline_ms, out, slot_ms, '0')
        end
        break
      end
      if near then hand_over(m, holder, record, payload, deadline_ms, out, 0, '0') end
    end
  end
  local late = redis.call('ZRANGEBYSCORE', handed, '-inf', now_ms, 'LIMIT', 0, BATCH)
  for _, holder in ipairs(late) do
    local record = redis.call('HGET', parked, holder)
    local token, state, _, payload = parked_in(record)
    if (state == 'h' or state == 'p') and redis.call('ZSCORE', waiters, holder) then
      if state == 'h' then bump('m_handover_retried', 1) end
      hand_over(m, holder, record, payload, deadline_ms, out, 0, state == 'h' and token or '0')
    else
      forget({holder}, {record})
    end
  end
  if #out > 0 then
    set_meta(m, 'handover', m.handover)
    bump('m_handed_over', #out / 4)
  end
  return out
end

-- See above; ``m``: loaded ``freeing``. Returns the handovers (dispatch()).
local function after_free(m, declared, channel, cfg)
  grant_in_place(m, declared, channel)
  wake(m, declared, channel)
  return dispatch(m, declared, cfg)
end
