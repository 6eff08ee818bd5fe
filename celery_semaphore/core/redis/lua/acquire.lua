-- acquire.lua: take a permit, or take/keep a place in line. Never blocks.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's AcquireArgs, read as ARGV[ARG.<name>]:
-- ARG.holder       id of the contender
-- ARG.declared     the caller's limit (see effective_limit()); recorded in meta.limit
-- ARG.lease_ms     lease of a granted permit
-- ARG.waiter_ms    how long a refused contender keeps its place; 0: don't queue
-- ARG.ticket       a ticket presented again, or ''
-- ARG.info         free text stored with the holder/waiter (shown by status)
-- ARG.idle_ms      every key expires after this long without use
-- ARG.channel      the wake channel, for after_free(), when reclaiming made room
-- ARG.handover     the token of the handed-over copy this is, or ''
-- ARG.dispatch     '' or "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARG.in_place     '1': the contender, if refused, waits in place (subscribed
--                  to the wake channel): a release may grant it the permit
--                  directly (see grant_in_place()); '': it does not
-- ARG.family       '' or the family of semaphores this one belongs to (recorded
--                  in meta.family for metrics.py)
-- ARG.rate         '' or the caller's rate, "<interval µs>|<burst>" (see "Rates"
--                  in common_rates.lua); recorded in meta.rate
-- ARG.shadow       the caller's limits that only count, never refuse: '', 'l'
--                  (the concurrency limit), 'r' (the rate) or 'lr'. A grant one of
--                  them would have refused counts in m_shadow_limit / m_shadow_rate
--                  (and how late the rate's slot was, in m_shadow_wait_ms; the
--                  most permits held at once over the limit, in m_shadow_peak); the
--                  rate's schedule moves on as if enforced, so its lateness grows
--                  while tasks start faster than the rate. A drain still refuses.
--                  Recorded in meta.shadow (see "Shadow limits" in common_rates.lua).
-- ARG.weight       "<permits>|<grants>" the contender asks for at once, or ''
--                  (1|1; see "Weights" in common_weights.lua), and its priority and
--                  fair key if it has them (see "The order of the line" there)
--
-- Returns {1, fencing token, lease expiry ms, now ms, waited ms, the shadow limits that
-- would have refused it ('', 'l', 'r', 'lr'), ms its slot was ahead by a shadow rate, handovers}
-- when granted, {0, ticket, position, holders, effective limit, draining 0/1,
-- earliest lease expiry ms or 0, now ms, average hold ms or 0, average ms
-- between grants while others wait or 0, when admissions resume after a data
-- loss (ms) or 0, µs until the rate allows this contender a grant (its slot;
-- '' without a rate), when a RateLimited pause of the rate ends (ms) or 0,
-- handovers} when refused (ticket 0:
-- not queued), {2, current handover token} when this is a
-- stale copy of a handed-over waiter (changes nothing). ``handovers``:
-- {holder, token, payload, delay ms, ...} due after reclaiming, or, under a rate,
-- after a grant (the next slots: see dispatch()). A contender the rate alone refuses
-- (a permit was free for it) counts in m_throttled.
-- A holder that already holds a live permit is granted again: same slot, new token;
-- but one restored by id after a data loss (token 0) asks because it held nothing
-- (it was waiting): that entry is dropped and it asks like anyone else.

local g = {
  holder = ARGV[ARG.holder], declared = ARGV[ARG.declared], lease_ms = tonumber(ARGV[ARG.lease_ms]),
  waiter_ms = tonumber(ARGV[ARG.waiter_ms]), presented = tonumber(ARGV[ARG.ticket]),
  info = ARGV[ARG.info], idle_ms = tonumber(ARGV[ARG.idle_ms]), channel = ARGV[ARG.channel],
  handover = ARGV[ARG.handover], cfg = ARGV[ARG.dispatch], family = ARGV[ARG.family],
  shadow = ARGV[ARG.shadow], weight = ARGV[ARG.weight] or '',
}
g.want_k, g.want_j = weight_in(g.weight)
declared_rate, declared_shadow = ARGV[ARG.rate], g.shadow

if g.handover ~= '' and arrival(g.holder, g.handover) == 'stale' then
  return {2, token_of(redis.call('HGET', parked, g.holder))}
end

local s = open_gate(g, false)
local result
-- A new contender is weighed where its new ticket would go (ahead of the less urgent
-- waiters, at its key's turn), not behind everyone.
if weigh_gate(s, g, s.ticket or place_ticket(s.m, g.weight).ticket) then
  result = {1, unpack(grant_gate(s, g))}
else
  local ticket = s.ticket
  if g.waiter_ms > 0 and not ticket then
    ticket = new_ticket(s.m, g.weight, s.meta_writes)
  end
  result = {0, unpack(refuse_gate(s, g, ticket, g.waiter_ms, ARGV[ARG.in_place] == '1', true))}
end
result[#result + 1] = finish_gate(s, g)
return result
