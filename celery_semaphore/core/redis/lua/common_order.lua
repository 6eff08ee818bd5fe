-- common_order.lua, of the prelude (see common_keys.lua): where a new ticket goes.
--
-- The order of the line: priority and fair share ----------------------------------
--
-- A contender's weight text may go on: "<k>|<j>|<priority>" or
-- "<k>|<j>|<priority>|<fair weight>|<fair key>" (order_in()). Its ticket, when it takes
-- a new one (new_ticket()), is then not just the next in time:
--   * priority p (-255..255, higher goes first; 0 unless said), without a fair key:
--     the ticket is moved p x PRIORITY_STEP (2^40 µs, about 12.7 days) earlier, so it
--     goes ahead of every less urgent waiter, in time order among equals.
--   * a fair key: the line is shared between the keys that have waiters, in turns
--     (start-time fair queuing): each key has a tail in meta "f|<key>" =
--     "<tail>|<waiting>|<urgent tail>|<grants>|<minute>|<grants the minute before>|<tie>"
--     (fair_in()), and a new waiter of the key starts at max(head of the line, its tail)
--     (the head among the tickets no priority moved: fair_head()); its tail then
--     moves on one turn, FAIR_TURN / its fair weight. So keys alternate (weight 3 takes
--     three turns to one), a key alone takes every turn, and within a key tickets grow:
--     FIFO. A waiter more urgent than the least urgent priority the line has seen
--     (meta.fair_low, at most 0) starts at its key's urgent tail instead (its
--     key's next turn), and its key's tail still moves on (it pays the turn back at
--     the end of its line). "<waiting>" counts the key's waiters (from their meta w|
--     records): at 0 the key's record goes (it leaves the rotation; n_fair_keys counts
--     the records). Within one turn, keys go in the order they joined the rotation
--     (<tie>, the low bits of their tickets: meta.fair_joins counts the joins).
-- A waiter with such a text keeps it in meta "w|<waiter>" like a weight, so leaving the
-- line knows its key.

-- Fair share ------------------------------------------------------------------------

-- FAIR_TURN and PRIORITY_STEP: from celery_semaphore/core/constants.py.
local TIE_BITS = 1024

-- A key's record text (or false) as {tail, waiting (its waiters in line), urgent_tail,
-- grants (in minute ``minute``), minute, grants_before (in the minute before), tie}:
-- numbers, 0 where absent. fair_text() writes it back.
local function fair_in(text)
  local parts = {}
  for part in string.gmatch(text or '', '([^|]*)|?') do
    if #parts == 7 then break end
    parts[#parts + 1] = tonumber(part) or 0
  end
  return {tail = parts[1] or 0, waiting = parts[2] or 0, urgent_tail = parts[3] or 0,
    grants = parts[4] or 0, minute = parts[5] or 0, grants_before = parts[6] or 0,
    tie = parts[7] or 0}
end

local function fair_text(fair)
  return fmt(fair.tail) .. '|' .. fmt(fair.waiting) .. '|' .. fmt(fair.urgent_tail) .. '|'
    .. fmt(fair.grants) .. '|' .. fmt(fair.minute) .. '|' .. fmt(fair.grants_before) .. '|'
    .. fmt(fair.tie)
end

-- A key's record (fair_in()), and whether it exists.
local function fair_record(key)
  local text = records_of({'f|' .. key})[1]
  return fair_in(text), text ~= false
end

-- meta.fair_grants, "<this minute's>|<minute>|<the minute before's>" (or false), as
-- {grants, minute, grants_before} (0 where absent), as in a key's record.
local function fair_grants_in(text)
  local counts = {}
  for part in string.gmatch(text or '', '([^|]+)') do counts[#counts + 1] = tonumber(part) end
  return {grants = counts[1] or 0, minute = counts[2] or 0, grants_before = counts[3] or 0}
end

-- Writes a key's record (``existed``: it was there), or drops it when nothing of the
-- key waits (``keep``: not yet: a new ticket's waiter is counted when it stands in
-- line). n_fair_keys counts the records.
local function put_fair(key, fair, existed, keep)
  local field = 'f|' .. key
  if fair.waiting <= 0 and not keep then
    if existed then
      redis.call('HDEL', meta, field)
      redis.call('HINCRBY', meta, 'n_fair_keys', -1)
    end
    return
  end
  if not existed then
    redis.call('HINCRBY', meta, 'n_fair_keys', 1)
    redis.call('HINCRBY', meta, 'fair_joins', 1)  -- the join place_ticket() gave its tie
  end
  redis.call('HSET', meta, field, fair_text(fair))
end

-- ``delta`` more (or fewer) waiters of ``key``.
local function count_fair(key, delta)
  local fair, existed = fair_record(key)
  fair.waiting = math.max(0, fair.waiting + delta)
  put_fair(key, fair, existed)
end

-- This minute's count, this minute, the minute before's: after ``cur`` grants in
-- minute ``at`` and ``prev`` in the one before.
local function roll_minute(cur, at, prev)
  local minute = math.floor(now_ms / 60000)
  if at == minute then return cur, minute, prev end
  return 0, minute, at == minute - 1 and cur or 0
end

-- The grants of this minute and the minute before (60 to 120 s), counted ``cur`` in
-- minute ``at`` and ``prev`` in the one before: an older count is 0.
local function recent_grants(cur, at, prev)
  local now_count, _, before = roll_minute(cur, at, prev)
  return now_count + before
end

-- The metrics' class of a fair weight: 0 for 1, 1 for 2-3, 2 for 4-7, 3 for 8-15, 4 above.
local function weight_class(fair_weight)
  local class = 0
  while fair_weight >= 2 and class < 4 do
    fair_weight, class = fair_weight / 2, class + 1
  end
  return class
end

-- Counts a grant to a waiter whose weight text is ``record``, if it has a fair key that
-- has waiters (status shows each key's share of the grants of the last minute or so:
-- meta.fair_grants "<this minute's>|<minute>|<the minute before's>" counts them all).
local function count_fair_grant(record)
  local _, fair_weight, key = order_in(record)
  if not key then return end
  local fair, existed = fair_record(key)
  if not existed then return end
  fair.grants, fair.minute, fair.grants_before =
    roll_minute(fair.grants, fair.minute, fair.grants_before)
  fair.grants = fair.grants + 1
  put_fair(key, fair, true)
  local all = fair_grants_in(records_of({'fair_grants'})[1])
  local cur, at, prev = roll_minute(all.grants, all.minute, all.grants_before)
  redis.call('HSET', meta, 'fair_grants', fmt(cur + 1) .. '|' .. fmt(at) .. '|' .. fmt(prev))
  bump('m_fair_granted_c' .. weight_class(fair_weight), 1)
end

-- The head of the line as the fair keys see it (``seq``: the next ticket in time): the
-- first ticket that no priority moved, else ``seq``. A ticket an urgent waiter without
-- a key took is 2^40 µs early per level: a key starting there would be given that much
-- of a head start over the keys already in line. Fair tickets are virtual times that
-- run ahead of the clock under a steady backlog (a turn is about 1 s of them), so the
-- head is looked for near the fair clock (meta.fair_clock: the head the last fair
-- ticket started from, ``clock``) when that is ahead of ``seq``.
local function fair_head(seq, clock)
  local anchor = math.max(seq, tonumber(clock) or 0)
  local band = PRIORITY_STEP / 2
  local head = redis.call('ZRANGEBYSCORE', waiters, fmt(anchor - band), fmt(anchor + band),
    'WITHSCORES', 'LIMIT', 0, 1)
  return tonumber(head[2]) or seq
end

-- Where a new ticket for a contender whose weight text is ``order`` goes (see "The
-- order of the line"), without taking it: {ticket, seq (the next ticket in time)}, and
-- with a fair key also key, fair (its record once the ticket is taken), existed, head,
-- low (meta.fair_low once the ticket is taken).
local function place_ticket(m, order)
  local seq = seq_after(m.ticket)
  local priority, fair_weight, key = order_in(order)
  if not key then return {ticket = seq - priority * PRIORITY_STEP, seq = seq} end
  local text, clock, joins, low = unpack(records_of({'f|' .. key, 'fair_clock', 'fair_joins',
    'fair_low'}))  -- one read for all a new fair ticket needs
  local head = fair_head(seq, clock)
  local fair, existed = fair_in(text), text ~= false
  if not existed then  -- it joins the rotation: put_fair() counts the join
    fair.tie = ((tonumber(joins) or 0) + 1) % TIE_BITS
  end
  -- Urgent: more urgent than the least urgent priority this line has seen (0 unless a
  -- lower one came: on Redis, a default of 5 is -5 here, and 0 is then urgent).
  low = math.min(0, tonumber(low) or 0, priority)
  local turn = FAIR_TURN / fair_weight
  local start
  if priority > low then
    start = math.max(head, fair.urgent_tail)
    fair.urgent_tail = start + turn
    fair.tail = math.max(head, fair.tail) + turn
  else
    start = math.max(head, fair.tail)
    fair.tail = start + turn
  end
  return {ticket = math.floor(start) + fair.tie, seq = seq, key = key, fair = fair,
    existed = existed, head = head, low = low}
end

-- Takes the new ticket place_ticket() finds: meta.ticket moves on (in ``m`` and in
-- ``writes``, the caller's meta writes), and so do the key's tail and the fair clock.
local function new_ticket(m, order, writes)
  local placed = place_ticket(m, order)
  m.ticket = fmt(placed.seq)
  writes[#writes + 1] = 'ticket'
  writes[#writes + 1] = m.ticket
  if placed.key then
    put_fair(placed.key, placed.fair, placed.existed, true)
    writes[#writes + 1] = 'fair_clock'
    writes[#writes + 1] = fmt(placed.head)
    writes[#writes + 1] = 'fair_low'
    writes[#writes + 1] = fmt(placed.low)
  end
  return placed.ticket
end
