-- acquire.lua: take a permit, or take/keep a place in line. Never blocks.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV[1] holder           id of the contender
-- ARGV[2] declared limit   the caller's (see effective_limit()); recorded in meta.limit
-- ARGV[3] lease ms         lease of a granted permit
-- ARGV[4] waiter lease ms  how long a refused contender keeps its place; 0: don't queue
-- ARGV[5] ticket           a ticket presented again, or ''
-- ARGV[6] info             free text stored with the holder/waiter (shown by status)
-- ARGV[7] idle ms          every key expires after this long without use
-- ARGV[8] wake channel     for after_free(), when reclaiming made room
-- ARGV[9] handover token   the token of the handed-over copy this is, or ''
-- ARGV[10] dispatch        '' or "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARGV[11] in place        '1': the contender, if refused, waits in place (subscribed
--                          to the wake channel): a release may grant it the permit
--                          directly (see grant_in_place()); '': it does not
-- ARGV[12] family          '' or the family of semaphores this one belongs to (recorded
--                          in meta.family for metrics.py)
-- ARGV[13] rate            '' or the caller's rate, "<interval µs>|<burst>" (see "Rates"
--                          in common_rates.lua); recorded in meta.rate
-- ARGV[14] shadow          the caller's limits that only count, never refuse: '', 'l'
--                          (the concurrency limit), 'r' (the rate) or 'lr'. A grant one of
--                          them would have refused counts in m_shadow_limit / m_shadow_rate
--                          (and how late the rate's slot was, in m_shadow_wait_ms; the
--                          most permits held at once over the limit, in m_shadow_peak); the
--                          rate's schedule moves on as if enforced, so its lateness grows
--                          while tasks start faster than the rate. A drain still refuses.
--                          Recorded in meta.shadow (see "Shadow limits" in common_rates.lua).
-- ARGV[15] weight          "<permits>|<grants>" the contender asks for at once, or ''
--                          (1|1; see "Weights" in common_weights.lua), and its priority and
--                          fair key if it has them (see "The order of the line" there)
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
  holder = ARGV[1], declared = ARGV[2], lease_ms = tonumber(ARGV[3]), waiter_ms = tonumber(ARGV[4]),
  presented = tonumber(ARGV[5]), info = ARGV[6], idle_ms = tonumber(ARGV[7]), channel = ARGV[8],
  handover = ARGV[9], cfg = ARGV[10], family = ARGV[12], shadow = ARGV[14], weight = ARGV[15] or '',
}
g.want_k, g.want_j = weight_in(g.weight)
declared_rate, declared_shadow = ARGV[13], g.shadow

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
  result = {0, unpack(refuse_gate(s, g, ticket, g.waiter_ms, ARGV[11] == '1', true))}
end
result[#result + 1] = finish_gate(s, g)
return result
