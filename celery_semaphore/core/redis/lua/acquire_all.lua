-- acquire_all.lua: a permit on every one of n semaphores, or on none. Never blocks.
--
-- KEYS: n groups of the ten of common_keys.lua, one per semaphore (its call_keys), in the
-- caller's order; every group's tenth is the same epoch hash (one Redis, one slot).
-- ARGV: arguments.py's AcquireAllArgs, then a Gate per semaphore, read as ARGV[ARG.<name>]:
-- ARG.holder       id of the contender, the same in every semaphore
-- ARG.hold_ms      hold back: its place in the lines of the semaphores that would admit
--                  it, while another refuses it (it waits, and asks again when woken);
--                  0: it leaves those lines
-- ARG.info         as in acquire.lua
-- ARG.ticket       a ticket presented again, or ''
-- ARG.handover     "<i>|<token>": the contender is the copy of a parked task
--                  that semaphore i handed over with that token (see arrival()
--                  in common_parked.lua; a stale copy changes nothing), or ''
-- Then semaphore i's Gate, each as in acquire.lua (waiter_ms 0: don't queue), read as
-- ARGV[a + ARG.gate.<name>] from a = ARG.gate.first + ARG.gate.size * (i - 1):
-- ARG.gate.declared
-- ARG.gate.lease_ms
-- ARG.gate.waiter_ms
-- ARG.gate.idle_ms
-- ARG.gate.channel
-- ARG.gate.dispatch
-- ARG.gate.family
-- ARG.gate.rate
-- ARG.gate.shadow
-- ARG.gate.weight
--
-- Each semaphore is weighed exactly as acquire.lua weighs it (admit.lua): reclaim,
-- effective limit, rate room, drain, the pause after a data loss, weights, shadow
-- limits, and a live permit the holder holds already (admitted again, as there). Then
--   * every one admits: a permit on every one (acquire.lua's grant on each: new fencing
--     tokens, the rate's grants spent, its place in each line left);
--   * one refuses: nothing is granted anywhere (no permit, no rate grant spent, tat
--     untouched). It stands in line in every semaphore that refused it (with that
--     semaphore's waiter lease; m_refused counts there), and in those that would have
--     admitted it only for ``hold back`` ms: else it leaves them, so it holds back no
--     later contender where it could have been served. A permit it held already on one
--     of them (a redelivered job) is left as it is, and it does not stand in that line.
-- One ticket in every line: the smallest of the one presented and those of its places
-- in these lines (if one semaphore's weight text has a fair key: of the one presented
-- and its place in that line); with none, one new ticket, after every semaphore's
-- meta.ticket, and written to each (at its key's turn in the fair line: see "The order
-- of the line" in common_order.lua). So two contenders stand in the same order in every line
-- they share.
-- It is never marked waiting in place (see "Several semaphores at once" in common_keys.lua).
--
-- Returns {1, G_1, .., G_n} when granted, G_i = {fencing token, lease expiry ms, now ms,
-- waited ms, shadow limits that would have refused it, ms its slot was ahead by a shadow
-- rate, handovers} (acquire.lua's code-1 fields, per semaphore), or {0, ticket, refused
-- by, R_1, .., R_n} when refused: ``ticket`` its one ticket (0: not queued), ``refused
-- by`` one character per semaphore ('1': it refused), R_i acquire.lua's code-0 fields for
-- semaphore i (ticket 0 where it does not stand in line); {2, i, current handover token}
-- for a stale copy of a task semaphore i handed over.

local n = #KEYS / 10
local gates, states = {}, {}
local hold_back_ms = tonumber(ARGV[ARG.hold_ms])
local each = ARG.gate
for i = 1, n do
  local a = each.first + each.size * (i - 1)
  local g = {
    holder = ARGV[ARG.holder], info = ARGV[ARG.info], presented = tonumber(ARGV[ARG.ticket]),
    handover = '', declared = ARGV[a + each.declared], lease_ms = tonumber(ARGV[a + each.lease_ms]),
    waiter_ms = tonumber(ARGV[a + each.waiter_ms]), idle_ms = tonumber(ARGV[a + each.idle_ms]),
    channel = ARGV[a + each.channel], cfg = ARGV[a + each.dispatch], family = ARGV[a + each.family],
    rate = ARGV[a + each.rate], shadow = ARGV[a + each.shadow], weight = ARGV[a + each.weight],
  }
  g.want_k, g.want_j = weight_in(g.weight)
  gates[i] = g
end

local by, token = string.match(ARGV[ARG.handover], '^(%d+)|(%d+)$')
if by then
  by = tonumber(by)
  use(by, gates[by].rate, gates[by].shadow)
  if arrival(ARGV[ARG.holder], token) == 'stale' then
    return {2, by, token_of(redis.call('HGET', parked, ARGV[ARG.holder]))}
  end
  gates[by].handover = token
end

local ticket, queue, fair = nil, false, nil
for i = 1, n do
  use(i, gates[i].rate, gates[i].shadow)
  states[i] = open_gate(gates[i], true)
  local t = states[i].ticket
  if t and (not ticket or t < ticket) then ticket = t end
  queue = queue or gates[i].waiter_ms > 0
  if not fair and select(3, order_in(gates[i].weight)) then fair = i end
end
-- With a fair key, its place in that line (or the ticket presented) is its ticket: the
-- others' (a place taken at publish, in time) would put it out of its key's turn.
if fair then ticket = states[fair].ticket end
-- Without a ticket: where one new ticket for every line would go, weighed there: at its
-- key's turn in the one semaphore that has its fair key (``fair``), else by its
-- priority (the same in every line).
local seq, placed = 0, ticket
if not ticket then
  for i = 1, n do seq = math.max(seq, seq_after(states[i].m.ticket)) end
  if fair then
    use(fair, gates[fair].rate, gates[fair].shadow)
    placed = place_ticket(states[fair].m, gates[fair].weight).ticket
  else
    placed = seq - order_in(gates[1].weight) * PRIORITY_STEP
  end
end
local all = true
for i = 1, n do
  use(i, gates[i].rate, gates[i].shadow)
  states[i].admits = weigh_gate(states[i], gates[i], placed)
  all = all and states[i].admits
end

if not all and queue and not ticket then  -- it takes that ticket
  for i = 1, n do
    local writes = states[i].meta_writes
    writes[#writes + 1] = 'ticket'
    writes[#writes + 1] = fmt(seq)
  end
  if fair then  -- its key's tail moves on (and the fair clock)
    use(fair, gates[fair].rate, gates[fair].shadow)
    new_ticket(states[fair].m, gates[fair].weight, states[fair].meta_writes)
  end
  ticket = placed
end

local rows, refused_by = {}, {}
for i = 1, n do
  local s, g = states[i], gates[i]
  use(i, g.rate, g.shadow)
  local row
  if all then
    row = grant_gate(s, g)
  elseif not s.admits then
    row = refuse_gate(s, g, ticket, g.waiter_ms, false, true)
  elseif hold_back_ms > 0 and g.waiter_ms > 0 and not s.held then
    row = refuse_gate(s, g, ticket, hold_back_ms, false, false)
  else
    leave_gate(s, g)
    row = refuse_gate(s, g, ticket, 0, false, false)
  end
  refused_by[i] = s.admits and '0' or '1'
  row[#row + 1] = finish_gate(s, g)
  rows[i] = row
end
if all then return {1, unpack(rows)} end
return {0, ticket or 0, table.concat(refused_by), unpack(rows)}
