-- common_rates.lua, of the prelude (see common_keys.lua): the rate, and the limits that
-- bind the line.
--
-- Rates --------------------------------------------------------------------------
--
-- A semaphore may also cap how fast permits are granted: at most ``burst`` grants at
-- once after an idle spell, then one every ``interval`` µs (GCRA, the generic cell rate
-- algorithm: one timestamp, meta.tat, the theoretical arrival time of the next grant;
-- a grant is allowed while tat - now <= (burst - 1) * interval, and moves tat on by
-- one interval). A rate is "<interval µs>|<burst>"; the effective one, effective_rate():
-- meta.rate_override (set-rate), else the caller's where it declares one
-- (``declared_rate``, '' for none: acquire and enqueue), else the recorded one
-- (meta.rate: the last acquirer's), else none. meta.rate_pause (ms): until then the
-- rate grants nothing (RateLimited raised by a task body, configure.lua). A grant spends
-- its interval whatever happens to the permit afterwards. rate_room() says how many
-- grants the rate allows now and when the next one after those is allowed; every
-- grant (acquire, grant_in_place()) takes at most that many, in line order, and
-- dispatch() hands waiters over at their slots (see there).

-- Shadow limits -----------------------------------------------------------------
--
-- A caller may declare its concurrency limit, its rate or both as shadow limits
-- (acquire.lua's ARG.shadow): they count the grants they would have refused, and refuse
-- none: '', 'l', 'r' or 'lr'. As with the limit, a caller that declares its own
-- (acquire, enqueue, release: ``declared_shadow``) goes by it, and the others (park,
-- dispatch, renew, configure) by the recorded one, meta.shadow (the last acquirer's; an
-- enqueue records its own only where no limit is recorded). What moves the line obeys
-- only the limits that bind (line_limit(), line_room()): a release wakes and hands over
-- waiters as if the shadow limits were not there, so no task waits for one. Grants in
-- place (grant_in_place()) obey the shadow limits too: a grant one of them would have
-- refused is made in person, where it is counted.

-- {interval = µs, burst = n} of the effective rate, or nil. ``m``: with rate and
-- rate_override loaded.
local function effective_rate(m)
  local spec = m.rate_override
  if not spec or spec == '' then
    if declared_rate ~= nil then spec = declared_rate else spec = m.rate end
  end
  local interval, burst = string.match(spec or '', '^(%d+)|(%d+)$')
  if not interval then return nil end
  return {interval = tonumber(interval), burst = tonumber(burst)}
end

-- meta.tat as the next grant sees it: a grant that comes up to half an interval
-- after its slot (the waiter's round trip, a hand-over) keeps the schedule, so the
-- long-run rate is the rate, not the rate less those delays; any window of
-- ``per`` seconds still sees at most count + burst grants.
local function rate_tat(m, rate)
  local tat = tonumber(m.tat) or 0
  if tat < now_us - math.floor(rate.interval / 2) then return now_us end  -- idle: from now
  return tat
end

-- How many grants the rate allows now (math.huge without a rate), and µs from now
-- until the first one after those (0 without a rate). ``m``: with tat and
-- rate_pause loaded too.
local function rate_room(m)
  local rate = effective_rate(m)
  if not rate then return math.huge, 0 end
  local pause_us = (tonumber(m.rate_pause) or 0) * 1000 - now_us
  if pause_us > 0 then return 0, pause_us end
  local tat = rate_tat(m, rate)
  local room = math.max(0, math.floor((now_us + rate.burst * rate.interval - tat) / rate.interval))
  return room, tat + (room - rate.burst + 1) * rate.interval - now_us
end

-- The limit and the rate's room that bind the line (see "Shadow limits"):
-- effective_limit() and rate_room(), or none (math.huge) where the caller's
-- declaration (else the recorded one) makes them shadow limits. ``m``: with
-- shadow loaded too.
local function shadows(m, code)
  return string.find(declared_shadow or m.shadow or '', code, 1, true) ~= nil
end

local function line_limit(m, declared)
  if shadows(m, 'l') then return math.huge end
  return effective_limit(m, declared)
end

local function line_room(m)
  if shadows(m, 'r') then return math.huge, 0 end
  return rate_room(m)
end

-- Whether a rate binds the line, given the ``room`` rate_room() gave (a caller that
-- has it already: no second rate_room()).
local function rate_binds(m, room)
  return room ~= math.huge and not shadows(m, 'r')
end

-- µs from now until the rate allows a grant to the waiter at ``position`` (1: the
-- head of the line), given rate_room()'s ``room`` and ``next_us``: 0 for the first
-- ``room``, then one interval apart.
local function slot_in(m, room, next_us, position)
  if position <= room then return 0 end
  return next_us + (position - room - 1) * effective_rate(m).interval
end

-- Spends ``n`` grants made now: tat moves on by n intervals (returns the fields to
-- write, or nothing without a rate).
local function spend_rate(m, n, writes)
  local rate = effective_rate(m)
  if not rate or n == 0 then return end
  local tat = rate_tat(m, rate) + n * rate.interval
  m.tat = fmt(tat)
  writes[#writes + 1] = 'tat'
  writes[#writes + 1] = m.tat
end
