-- common.lua: prepended to every script of this folder (see celery_semaphore/core/scripts.py).
--
-- KEYS (the same ten, in this order, for every script; one hash tag per semaphore):
--   KEYS[1] holders  ZSET  holder -> lease expiry, ms of server time
--   KEYS[2] hinfo    HASH  holder -> "<fencing token>|<acquired ms>[/<permits>]|<info>"
--                          (permits: its weight, if more than 1; see "Weights" below)
--   KEYS[3] waiters  ZSET  holder -> ticket (place in line; lower goes first)
--   KEYS[4] wexp     ZSET  holder -> waiter lease expiry, ms of server time
--   KEYS[5] winfo    HASH  holder -> "<first ask ms>|<info>"
--   KEYS[6] meta     HASH  limit (recorded: the last declarer's), override, draining, fence,
--                          ticket, handover, released, hold_ms, grant_at, grant_gap_ms,
--                          family, n_parked, n_handed, rate, rate_override, tat,
--                          rate_pause (see "Rates" below), n_weighted and
--                          "w|<waiter>" (see "Weights" below), shadow (see "Shadow
--                          limits" below), and the m_* counters (and the
--                          high-water mark m_shadow_peak)
--                          metrics.py exports; layout (see LAYOUT)
--   KEYS[7] parked   HASH  holder -> "<handover token>|<state>|<mark>|<payload>": a waiter
--                          that left its payload to be handed over when due, or one
--                          waiting in place (see "Parked records" below)
--   KEYS[8] handed   ZSET  holder -> when to hand it over (again), or forget its record
--   KEYS[9] sent     ZSET  holder -> when its task was published with a place in line
--                          (enqueue.lua), until it first asks or is released: so a task
--                          whose place lapsed while its message sat in the broker is
--                          still seen (status.lua); entries older than the sent horizon
--                          (an hour, at most the idle time) are dropped: a message the
--                          broker lost is not counted forever
--   KEYS[10] epoch HASH    one per Redis (per slot on a Cluster), no expiry: epoch,
--                          lost_ms, resumes_ms, restored (see "Data loss" below)
--
-- ARGV[#ARGV] (every script): "<epoch the caller knows, or ''>|<pause ms>" (see below;
-- pause 0: a reader, status.lua).
--
-- Tickets and fencing tokens are max(last + 1, server time in µs): strictly
-- increasing even after the meta hash expired or Redis lost its data.
--
-- holders and hinfo hold the same members, and so do waiters, wexp and winfo:
-- each group is written and deleted together by one script, and touch() gives
-- all six keys the same expiry. So ZCARD waiters == 0 means that wexp and winfo
-- are absent too, which lets the hot paths skip the waiter keys entirely.
--
-- The meta hash is read once per call: load_meta() reads the fields the call needs
-- into a table ``m`` that the helpers take (reading a field not loaded raises: it cannot
-- pass for an absent one); set_meta(), write_meta() and count_released() keep ``m``
-- current.
--
-- The effective limit, effective_limit(): the runtime override if set, else the limit
-- the caller declares (acquire, enqueue, release, status pass theirs), else the
-- recorded one (meta.limit: every acquire records its own, an enqueue only where none
-- is), else 0. Callers that declare none (park, dispatch, renew, configure) get the
-- override, else the recorded limit. So two declarations that disagree are each
-- obeyed by their own caller, and what a caller hands on (after_free()) stays within
-- its own effective limit.
--
-- What follows freed capacity (a released permit, a reclaimed lease or waiter, a
-- waiter leaving the line, a raised limit, an ended drain), after_free(): free
-- permits go to the waiters in place at the head of the line (FIFO: up to the first
-- one that is not), the others are woken, the parked waiters now due are handed
-- over. Every script that frees anything calls it; enqueue hands over nothing unless
-- it parks (a publisher calls it inside before_task_publish; the next release or
-- heartbeat does).
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
--
-- Shadow limits -----------------------------------------------------------------
--
-- A caller may declare its concurrency limit, its rate or both as shadow limits
-- (acquire.lua's ARGV[14]): they count the grants they would have refused, and refuse
-- none: '', 'l', 'r' or 'lr'. As with the limit, a caller that declares its own
-- (acquire, enqueue, release: ``declared_shadow``) goes by it, and the others (park,
-- dispatch, renew, configure) by the recorded one, meta.shadow (the last acquirer's; an
-- enqueue records its own only where no limit is recorded). What moves the line obeys
-- only the limits that bind (line_limit(), line_room()): a release wakes and hands over
-- waiters as if the shadow limits were not there, so no task waits for one. Grants in
-- place (grant_in_place()) obey the shadow limits too: a grant one of them would have
-- refused is made in person, where it is counted.
--
-- Weights ------------------------------------------------------------------------
--
-- A contender may ask for k permits and j of the rate's grants at once (its weight:
-- "<k>|<j>"; 1|1 unless said). A holder of k > 1 permits is k members of holders:
-- itself and its seats "<holder>\0<2..k>" (holder ids never contain \0), all with its
-- lease expiry, so ZCARD holders counts the permits in use and reclaim() frees all k
-- at once; its hinfo record says k ("/<k>" after the acquired ms). A waiter whose weight is not 1|1 has
-- meta "w|<waiter>" = "<k>|<j>" while it is in line (stand_in_line(), leave_line());
-- meta.n_weighted counts those, so the line's weights are read only while one is in it.
-- A waiter is granted when the permits and grants of those ahead and its own fit in the
-- free permits and in the rate's room: FIFO, so a heavy waiter at the head holds back
-- those behind it until its k permits are free (fit()).
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
--     "<tail>|<waiting>|<urgent tail>|<grants>|<minute>|<grants the minute before>|<tie>", and
--     a new waiter of the key starts at max(head of the line, its tail) (the head
--     among the tickets no priority moved: fair_head()); its tail then
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

-- Parked records ---------------------------------------------------------------
--
-- "<handover token>|<state>|<mark>|<payload>"; no record: the waiter asks itself.
--
--   from       to    by                              when
--   any        p     park.lua, enqueue.lua           it parks (token 0, mark: meta.released)
--   p          h     dispatch()                      it is due (see dispatch()): a new token
--   h          h     dispatch()                      not arrived by its deadline: a new token
--   h          d     acquire.lua (arrival())         the copy handed over last arrives
--   h          x     acquire.lua (served())          served in person, a copy on its way
--   p          -     acquire.lua                     it asks in person, or is served so
--   -, d, w    w     acquire.lua (mark_in_place())   refused while it waits in place
--   w          d, -  unmark_in_place()               it asks without waiting in place, or is
--                                                    served (d: it had arrived by a handover)
--   p, h       -     dispatch.lua                    named as revoked
--   any        -     reclaim(), release.lua by id    its place lapsed; it left the line
--   p, h       -     dispatch()                      its handed entry is due, not in line
--   d, x (w)   -     dispatch()                      TOMBSTONE_MS after the tombstone was made
--                                                    (and a w mark made on one)
--
-- p: parked, h: handed over, d: arrived (tombstone), x: served by another copy of its
-- task (tombstone: that copy is stale), w: waiting in place ("<token>|w|<lease ms>|").
-- n_parked and n_handed in meta count the p and h records.
--
-- Several semaphores at once ------------------------------------------------------
--
-- acquire_all.lua takes the keys of n semaphores (n groups of the ten above, one epoch
-- hash) and grants a contender a permit on every one or on none: see its header.
-- use() points the helpers at one group. A contender asking that way is never marked
-- waiting in place (w): grant_in_place() would grant it one semaphore alone; so it
-- stops the in-place grants behind it in a line (FIFO), and asks again when woken.
--
-- Data loss ----------------------------------------------------------------------
--
-- The epoch hash names the data a Redis holds: made by the first script that finds
-- it absent, it goes only with the data (a restart without persistence, a failover to
-- a replica that lagged, a flush). Each client remembers the epoch it last saw and
-- presents it; a script runs only for a client that presents the current one, and
-- answers any other with {'celery_semaphore:epoch', epoch, lost ms, resumes ms, now ms}
-- (the client remembers that epoch and calls again). A client that presents an
-- epoch which is gone has seen the data lost:
--
--   epoch absent, the caller knew none       first use: a new epoch, no pause
--   epoch absent, the caller knew one        lost: a new epoch, lost_ms = now,
--                                            resumes_ms = now + the caller's pause ms
--   another epoch, made by a first use       lost, noticed only now (its maker knew
--   (lost_ms 0), the caller knew one         no epoch): the same pause, from now
--
-- A reader (pause 0) neither makes nor learns an epoch: it reads what is there (a
-- reading must not pass a loss for a first use in its process, which may be a
-- worker's).
--
-- Until resumes_ms nothing is granted or handed over (paused(): like a drain); the
-- workers write back the permits of the tasks they run (renew.lua restores missing
-- holders while paused; restored counts them), so the line resumes in order after
-- the pause, under the limit, however many holders came back. A holder restored
-- by id alone (token 0) may have been a waiter: its own next ask drops it
-- (acquire.lua).

-- Set by begin() at the start of every call (a Functions library keeps these between
-- calls: nothing of one call may leak into the next):
local holders, hinfo, waiters, wexp, winfo, meta  -- KEYS[1..6]
local parked, handed, sent, epoch_key  -- KEYS[7..10]
local now_us, now_ms, now_text  -- the server's clock (now_text: now_ms as text)
local EPOCH_ARG  -- #ARGV: the last argument of every script; the others come before it
local resumes_ms  -- while admissions are paused after a data loss: when they resume, else 0
local declared_rate  -- the caller's rate ('': none), where it declares one (see "Rates")
local declared_shadow  -- the caller's shadow limits, where it declares them (see "Shadow limits")
local BATCH = 1000
local BATCH_TEXT = '1000'  -- BATCH as text (a library is loaded without tostring)
local GRANT_CHUNK = 16

-- Several semaphores in one call (acquire_all.lua): the helpers below work on the
-- semaphore whose keys these locals name; use(i, rate) points them at the i-th group
-- of ten KEYS, KEYS[10(i-1)+1 .. 10i], under that semaphore's declared ``rate``. Every
-- group's tenth key is the same epoch hash (one Redis, one Cluster slot).
local function use(i, rate, shadow)
  local b = 10 * (i - 1)
  holders, hinfo, waiters, wexp, winfo, meta = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4],
    KEYS[b + 5], KEYS[b + 6]
  parked, handed, sent, epoch_key = KEYS[b + 7], KEYS[b + 8], KEYS[b + 9], KEYS[b + 10]
  declared_rate = rate
  declared_shadow = shadow
end

local function fmt(n)
  if n % 1 == 0 then return string.format('%d', n) end
  return string.format('%.0f', n)
end

-- Meta ------------------------------------------------------------------------

local NOT_LOADED = {__index = function(_, field) error('meta.' .. field .. ' not loaded') end}

-- The meta ``fields`` (a list), and with ``freeing`` those after_free() reads, in one
-- HMGET: {field = value, or false if absent}.
local function load_meta(fields, freeing)
  if freeing then
    local wanted = {}
    for i = 1, #fields do wanted[fields[i]] = true end
    fields = {unpack(fields)}
    for _, field in ipairs({'limit', 'override', 'draining', 'fence', 'grant_at', 'grant_gap_ms',
        'released', 'hold_ms', 'handover', 'rate', 'rate_override', 'tat', 'rate_pause',
        'n_weighted', 'shadow'}) do
      if not wanted[field] then fields[#fields + 1] = field end
    end
  end
  local values = redis.call('HMGET', meta, unpack(fields))
  local m = {}
  for i = 1, #fields do m[fields[i]] = values[i] end
  return setmetatable(m, NOT_LOADED)
end

-- Sets ``field`` to ``value`` in meta and in ``m``.
local function set_meta(m, field, value)
  m[field] = value
  redis.call('HSET', meta, field, value)
end

-- Sets ``writes`` ({field, value, ...}) in meta and in ``m``, in one HSET.
local function write_meta(m, writes)
  for i = 1, #writes, 2 do m[writes[i]] = writes[i + 1] end
  redis.call('HSET', meta, unpack(writes))
end

-- The records meta keeps besides its fields (weights, fair keys: see the header), read
-- where they are needed: {value, or false}.
local function records_of(fields)
  return redis.call('HMGET', meta, unpack(fields))
end

-- The records meta keeps whose field matches ``pattern`` (HSCAN): {field, value, ...},
-- and whether the scan went through the whole hash. At most ``calls`` calls of COUNT
-- ``count``, so a hash of more fields than that (each call examines about ``count``
-- of them) yields a bounded sample: the fields of the buckets examined.
local function scan_records(pattern, calls, count)
  local found, cursor = {}, '0'
  for _ = 1, calls do
    local reply = redis.call('HSCAN', meta, cursor, 'MATCH', pattern, 'COUNT', count)
    cursor = reply[1]
    for _, item in ipairs(reply[2]) do found[#found + 1] = item end
    if cursor == '0' then return found, true end
  end
  return found, false
end

local function bump(field, n)
  if n > 0 then redis.call('HINCRBY', meta, field, n == 1 and '1' or fmt(n)) end
end

-- Counts ``n`` permits released (meta.released marks when a waiter parked: see
-- dispatch()); ``m``: nil for a caller that loads meta afterwards.
local function count_released(m, n)
  if n == 0 then return end
  local released = redis.call('HINCRBY', meta, 'released', n)
  if m then m.released = fmt(released) end
end

-- Whether nothing may be granted or handed over now: draining, or paused after a
-- data loss (see the header).
local function paused(m)
  return m.draining == '1' or resumes_ms > 0
end

-- The one rule (see the header). ``declared``: the caller's limit, or '' for none.
local function effective_limit(m, declared)
  return tonumber(m.override) or tonumber(declared) or tonumber(m.limit) or 0
end

-- The next fence, ticket or handover token after ``last`` (a meta field's value, if any).
local function seq_after(last)
  return math.max((tonumber(last) or 0) + 1, now_us)
end

local function next_seq(m, field)
  local value = seq_after(m[field])
  set_meta(m, field, fmt(value))
  return value
end

-- Histogram bucket bounds in ms; celery_semaphore/metrics.py has the same in seconds.
local BUCKETS = {5, 25, 100, 250, 1000, 2500, 10000, 30000, 60000, 300000, 1800000}

-- One observation of ``ms`` in histogram ``kind`` ('wait' or 'hold'): buckets
-- m_<kind>_b<i> are not cumulative; metrics.py adds them up. (The field names are
-- written out: making them on each call cost more than the two HINCRBYs.)
local HISTOGRAMS = {
  wait = {[0] = 'm_wait_b0', 'm_wait_b1', 'm_wait_b2', 'm_wait_b3', 'm_wait_b4', 'm_wait_b5',
    'm_wait_b6', 'm_wait_b7', 'm_wait_b8', 'm_wait_b9', 'm_wait_b10', 'm_wait_b11', sum = 'm_wait_sum'},
  hold = {[0] = 'm_hold_b0', 'm_hold_b1', 'm_hold_b2', 'm_hold_b3', 'm_hold_b4', 'm_hold_b5',
    'm_hold_b6', 'm_hold_b7', 'm_hold_b8', 'm_hold_b9', 'm_hold_b10', 'm_hold_b11', sum = 'm_hold_sum'},
}
local function observe(kind, ms)
  local index = 0
  while index < #BUCKETS and ms > BUCKETS[index + 1] do index = index + 1 end
  local fields = HISTOGRAMS[kind]
  redis.call('HINCRBY', meta, fields[index], '1')
  if ms >= 1 then redis.call('HINCRBY', meta, fields.sum, fmt(math.floor(ms))) end
end

-- Restarts the idle expiry of every key. ``no_waiters``: the caller knows the
-- waiter keys are absent (PEXPIRE would do nothing on them), so it skips them;
-- parked and handed are touched only where they exist. ``noted``: the caller wrote
-- this touch in meta.expiry (note_touch()); a touch that is not noted drops the note,
-- as its caller's idle time may be shorter than the noted one's (touch_due()).
local function touch(idle_ms, no_waiters, noted)
  if not noted then redis.call('HDEL', meta, 'expiry') end
  idle_ms = fmt(idle_ms)
  for i, key in ipairs({holders, hinfo, waiters, wexp, winfo, meta}) do
    if not (no_waiters and i >= 3 and i <= 5) then
      redis.call('PEXPIRE', key, idle_ms)
    end
  end
  if redis.call('HLEN', parked) > 0 then
    redis.call('PEXPIRE', parked, idle_ms)
    redis.call('PEXPIRE', handed, idle_ms)
  end
end

-- The hot calls (acquire, release) skip the touch while the last one they noted
-- (meta.expiry: when it made the keys expire; ``m``: with it loaded) leaves at least
-- 15/16 of this caller's idle time, and no other touch came since (touch() drops the
-- note: another process may declare a shorter idle time). A call that skips it creates no key, or expires
-- those it creates itself (a first holder) no sooner than the noted touch, so every key of the semaphore expires
-- between 15/16 of the idle time and the idle time after its last use.
-- touch_due(): whether this call must touch; note_touch(): adds the record (and
-- meta.layout: see LAYOUT) to ``writes`` ({field, value, ...}), which the caller writes to meta BEFORE it touches (so a meta
-- that the write creates expires too).
local TOUCH_SLACK = 16
-- A hash of few short fields is kept as a listpack, where each field lookup is a scan
-- of the whole hash: the 18 fields acquire reads cost about 3x more at 46 fields (what
-- a line soon leaves in meta: histogram buckets, counters) than in a hash table. A
-- value longer than hash-max-listpack-value (64 bytes by default) makes Redis keep the
-- hash as a hash table from then on. note_touch() writes one, meta.layout, where the
-- caller has a line (``line``), so an uncontended semaphore keeps the compact listpack.
local LAYOUT = 'a hash table: this value is longer than 64 bytes, so lookups take O(1)'
local function touch_due(m, idle_ms)
  local expiry = tonumber(m.expiry)
  return not expiry or expiry - now_ms < idle_ms - idle_ms / TOUCH_SLACK
end

local function note_touch(writes, idle_ms, line)
  writes[#writes + 1] = 'expiry'
  writes[#writes + 1] = fmt(now_ms + idle_ms)
  if line then
    writes[#writes + 1] = 'layout'
    writes[#writes + 1] = LAYOUT
  end
end

local function token_of(record)
  if not record then return nil end
  return string.match(record, '^(%d+)|')
end

local function earliest_expiry()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end

-- Weights (see the header) --------------------------------------------------------

local SEAT = '\0'

-- "<k>|<j>[|...]" (or '') as permits, grants.
local function weight_in(text)
  local k, j = string.match(text or '', '^(%d+)|(%d+)')
  return tonumber(k) or 1, tonumber(j) or 1
end

-- A weight text's priority (0 unless said), fair weight and fair key (nil: not fair);
-- see "The order of the line".
local function order_in(text)
  local p, fw, key = string.match(text or '', '^%d+|%d+|(%-?%d+)|(%d+)|(.*)$')
  if p then return tonumber(p), tonumber(fw), key end
  p = string.match(text or '', '^%d+|%d+|(%-?%d+)$')
  return tonumber(p) or 0, 1, nil
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

-- Fair share (see "The order of the line") ------------------------------------------

local FAIR_TURN = 1048576
local PRIORITY_STEP = 1099511627776
local TIE_BITS = 1024

local FAIR_FIELDS = 7

-- A key's record text (or false) as {tail, waiting, urgent tail, grants this minute,
-- the minute, grants the minute before, tie} (numbers; 0 where absent).
local function fair_fields(text)
  local f = {}
  for part in string.gmatch(text or '', '([^|]*)|?') do
    if #f == FAIR_FIELDS then break end
    f[#f + 1] = tonumber(part) or 0
  end
  for i = #f + 1, FAIR_FIELDS do f[i] = 0 end
  return f
end

-- A key's record (fair_fields()), and whether it exists.
local function fair_record(key)
  local text = records_of({'f|' .. key})[1]
  return fair_fields(text), text ~= false
end

-- Writes a key's record (``existed``: it was there), or drops it when nothing of the
-- key waits (``keep``: not yet: a new ticket's waiter is counted when it stands in
-- line). n_fair_keys counts the records.
local function put_fair(key, f, existed, keep)
  local field = 'f|' .. key
  if f[2] <= 0 and not keep then
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
  local parts = {}
  for i = 1, FAIR_FIELDS do parts[i] = fmt(f[i]) end
  redis.call('HSET', meta, field, table.concat(parts, '|'))
end

-- ``delta`` more (or fewer) waiters of ``key``.
local function count_fair(key, delta)
  local f, existed = fair_record(key)
  f[2] = math.max(0, f[2] + delta)
  put_fair(key, f, existed)
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
  local f, existed = fair_record(key)
  if not existed then return end
  f[4], f[5], f[6] = roll_minute(f[4], f[5], f[6])
  f[4] = f[4] + 1
  put_fair(key, f, true)
  local all = {}
  for part in string.gmatch(records_of({'fair_grants'})[1] or '', '([^|]+)') do
    all[#all + 1] = tonumber(part)
  end
  local cur, at, prev = roll_minute(all[1] or 0, all[2] or 0, all[3] or 0)
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
-- with a fair key also key, f (its record once the ticket is taken), existed, head.
local function place_ticket(m, order)
  local seq = seq_after(m.ticket)
  local priority, fair_weight, key = order_in(order)
  if not key then return {ticket = seq - priority * PRIORITY_STEP, seq = seq} end
  local text, clock, joins, low = unpack(records_of({'f|' .. key, 'fair_clock', 'fair_joins',
    'fair_low'}))  -- one read for all a new fair ticket needs
  local v = fair_head(seq, clock)
  local f, existed = fair_fields(text), text ~= false
  if not existed then  -- it joins the rotation: put_fair() counts the join
    f[7] = ((tonumber(joins) or 0) + 1) % TIE_BITS
  end
  -- Urgent: more urgent than the least urgent priority this line has seen (0 unless a
  -- lower one came: on Redis, a default of 5 is -5 here, and 0 is then urgent).
  low = math.min(0, tonumber(low) or 0, priority)
  local turn = FAIR_TURN / fair_weight
  local start
  if priority > low then
    start = math.max(v, f[3])
    f[3] = start + turn
    f[1] = math.max(v, f[1]) + turn
  else
    start = math.max(v, f[1])
    f[1] = start + turn
  end
  return {ticket = math.floor(start) + f[7], seq = seq, key = key, f = f, existed = existed,
    head = v, low = low}
end

-- Takes the new ticket place_ticket() finds: meta.ticket moves on (in ``m`` and in
-- ``writes``, the caller's meta writes), and so do the key's tail and the fair clock.
local function new_ticket(m, order, writes)
  local placed = place_ticket(m, order)
  m.ticket = fmt(placed.seq)
  writes[#writes + 1] = 'ticket'
  writes[#writes + 1] = m.ticket
  if placed.key then
    put_fair(placed.key, placed.f, placed.existed, true)
    writes[#writes + 1] = 'fair_clock'
    writes[#writes + 1] = fmt(placed.head)
    writes[#writes + 1] = 'fair_low'
    writes[#writes + 1] = fmt(placed.low)
  end
  return placed.ticket
end

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

-- Parked records (see the header) ----------------------------------------------

local TOMBSTONE_MS = 3600000
local PARKED_RECORD = '^(%d+)|(%a)|(%d+)|(.*)$'
local COUNTED = {p = 'n_parked', h = 'n_handed'}

local function state_in(record)
  return record and string.match(record, '^%d+|(%a)|') or nil
end

local function recount(before, after)
  if before == after then return end
  if COUNTED[before] then redis.call('HINCRBY', meta, COUNTED[before], -1) end
  if COUNTED[after] then redis.call('HINCRBY', meta, COUNTED[after], 1) end
end

-- Sets ``holder``'s record to ``record``; ``old``: the one it replaces (false: none).
-- put_record() and forget() are the only writers of ``parked``.
local function put_record(holder, record, old)
  redis.call('HSET', parked, holder, record)
  recount(state_in(old), state_in(record))
end

-- Deletes the records of the holders in ``list``; ``records``: theirs, if read already.
local function forget(list, records)
  records = records or redis.call('HMGET', parked, unpack(list))
  for _, record in ipairs(records) do recount(state_in(record), nil) end
  redis.call('HDEL', parked, unpack(list))
  redis.call('ZREM', handed, unpack(list))
end

-- Leaves ``payload`` for ``holder``, in line, to be handed over when due (dispatch()), or
-- ``due_ms`` from now at the latest (0: only when due); ``m``: with released loaded.
-- park.lua, and enqueue.lua when it parks.
local function leave_payload(m, holder, payload, due_ms)
  redis.call('ZREM', sent, holder)  -- its message now waits here, not in the broker
  put_record(holder, '0|p|' .. (m.released or '0') .. '|' .. payload,
    redis.call('HGET', parked, holder))
  if due_ms > 0 then
    redis.call('ZADD', handed, now_ms + due_ms, holder)
  else
    redis.call('ZREM', handed, holder)
  end
  bump('m_parked', 1)
end

local function mark_in_place(holder, lease_ms)
  local record = redis.call('HGET', parked, holder)
  local token, state = '0', nil
  if record then token, state = string.match(record, '^(%d+)|(%a)|') end
  if state == nil or state == 'd' or state == 'w' then
    put_record(holder, token .. '|w|' .. fmt(lease_ms) .. '|', record)
  end
end

-- ``holder`` (whose record is ``record``) no longer waits in place.
local function unmark_in_place(holder, record)
  local token, state = string.match(record or '', '^(%d+)|(%a)|')
  if state ~= 'w' then return end
  if token == '0' then
    forget({holder}, {record})
  else
    put_record(holder, token .. '|d|0|', record)
  end
end

-- ``holder`` got a permit without presenting a handover token: a handed-over copy
-- of its task still on its way is stale.
local function served(holder)
  local record = redis.call('HGET', parked, holder)
  if not record then return end
  local token, state = string.match(record, PARKED_RECORD)
  if state == 'h' then
    put_record(holder, token .. '|x|0|', record)
    redis.call('ZADD', handed, now_ms + TOMBSTONE_MS, holder)
  elseif state == 'p' then
    forget({holder}, {record})
  else
    unmark_in_place(holder, record)
  end
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

-- The line -----------------------------------------------------------------------

-- Takes the holders in ``list`` out of the line; returns how many were in it.
-- ``m``: with n_weighted loaded, or nil. ``fate`` of their parked records: 'forget' (they are gone), 'served' (they hold a
-- permit now: see served()), or nil (left as they are: an arrival made a tombstone).
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
local function stand_in_line(m, holder, ticket, lease_ms, info, weight)
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

-- Rates (see the header) ------------------------------------------------------------

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

-- The limit and the rate's room that bind the line (see "Shadow limits" in the
-- header): effective_limit() and rate_room(), or none (math.huge) where the
-- caller's declaration (else the recorded one) makes them shadow limits. ``m``: with
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

-- What follows freed capacity (see the header) -----------------------------------

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
      local state, lease_ms = string.match(redis.call('HGET', parked, holder) or '', '^%d+|(%a)|(%d+)|')
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

local function hand_over(m, holder, record, payload, deadline_ms, out, delay_ms)
  local token = fmt(seq_after(m.handover))
  m.handover = token  -- dispatch() writes it to meta once
  put_record(holder, token .. '|h|0|' .. payload, record)
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
-- copy is recognised when it arrives (acquire.lua answers code 2); or one that
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
      local _, state, mark, payload = string.match(record or '', PARKED_RECORD)
      local progress = state == 'p' and tonumber(mark) < released
      local near = state == 'p' and ((k <= permits and j <= room) or progress)
      local slot_ms = rate and math.ceil(slot_in(m, room, next_us, j) / 1000) or 0
      if slot_ms > rate_window_ms or rate_paused then
        if state == 'p' and (k <= permits or progress) and slot_ms <= deadline_ms then
          hand_over(m, holder, record, payload, deadline_ms, out, slot_ms)
        end
        break
      end
      if near then hand_over(m, holder, record, payload, deadline_ms, out, 0) end
    end
  end
  local late = redis.call('ZRANGEBYSCORE', handed, '-inf', now_ms, 'LIMIT', 0, BATCH)
  for _, holder in ipairs(late) do
    local record = redis.call('HGET', parked, holder)
    local _, state, _, payload = string.match(record or '', PARKED_RECORD)
    if (state == 'h' or state == 'p') and redis.call('ZSCORE', waiters, holder) then
      if state == 'h' then bump('m_handover_retried', 1) end
      hand_over(m, holder, record, payload, deadline_ms, out, 0)
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

-- See the header; ``m``: loaded ``freeing``. Returns the handovers (dispatch()).
local function after_free(m, declared, channel, cfg)
  grant_in_place(m, declared, channel)
  wake(m, declared, channel)
  return dispatch(m, declared, cfg)
end

-- Data loss (see the header) -------------------------------------------------------

-- nil if the caller presents the current epoch (and resumes_ms is set while paused);
-- else the reply that tells it the current one.
local function settle_epoch()
  local known, pause_ms = string.match(ARGV[EPOCH_ARG] or '', '^(%d*)|(%d+)$')
  if not known then return redis.error_reply('ERR celery_semaphore: no epoch argument') end
  local e = redis.call('HMGET', epoch_key, 'epoch', 'lost_ms', 'resumes_ms')
  local epoch, lost_ms, resumes = e[1], tonumber(e[2]) or 0, tonumber(e[3]) or 0
  if (epoch and epoch == known) or pause_ms == '0' then
    if resumes > now_ms then resumes_ms = resumes end
    return nil
  end
  if not epoch or (known ~= '' and lost_ms == 0) then
    epoch = epoch or fmt(now_us)
    if known ~= '' then
      lost_ms, resumes = now_ms, now_ms + tonumber(pause_ms)
    end
    redis.call('HSET', epoch_key, 'epoch', epoch, 'lost_ms', fmt(lost_ms),
      'resumes_ms', fmt(resumes))
    redis.call('HSETNX', epoch_key, 'restored', 0)
  end
  return {'celery_semaphore:epoch', epoch, lost_ms, resumes, now_ms}
end

-- The start of every call, before the script's own part (scripts.py puts it there):
-- points the helpers at the first semaphore of KEYS, reads the clock, settles the
-- epoch. Returns the epoch reply to answer instead of running the script, or nil.
local function begin()
  use(1, nil)
  local clock = redis.call('TIME')
  now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  now_ms = math.floor(now_us / 1000)
  now_text = fmt(now_ms)
  EPOCH_ARG = #ARGV
  resumes_ms = 0
  return settle_epoch()
end
