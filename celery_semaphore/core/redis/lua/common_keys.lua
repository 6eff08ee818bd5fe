-- common_keys.lua: the first part of the prelude of every script of this folder. The
-- prelude is the common_*.lua files, joined in the order scripts.py's COMMON gives (each
-- defines its locals before the next uses them); every script is the prelude followed by
-- its own file (see celery_semaphore/core/scripts.py). This part: the keys, the state of
-- one call, use(); the sections of the others are named in quotes ("Rates": in
-- common_rates.lua, "Weights": common_weights.lua, and so on).
--
-- KEYS (the same ten, in this order, for every script; one hash tag per semaphore):
--   KEYS[1] holders  ZSET  holder -> lease expiry, ms of server time
--   KEYS[2] hinfo    HASH  holder -> "<fencing token>|<acquired ms>[/<permits>]|<info>"
--                          (permits: its weight, if more than 1; see "Weights")
--   KEYS[3] waiters  ZSET  holder -> ticket (place in line; lower goes first)
--   KEYS[4] wexp     ZSET  holder -> waiter lease expiry, ms of server time
--   KEYS[5] winfo    HASH  holder -> "<first ask ms>|<info>"
--   KEYS[6] meta     HASH  the semaphore's settings, sequences and counts (common_meta.lua
--                          reads and writes it):
--     what callers declare and operators set (configure.lua sets the runtime ones):
--       limit          the recorded limit: the last acquirer's (an enqueue's where none is)
--       override       the runtime limit (set-limit)
--       draining       '1': nothing is granted or handed over
--       family         the family of semaphores this one belongs to (metrics.py's label)
--       rate           the recorded rate, "<interval µs>|<burst>" (see "Rates")
--       rate_override  the runtime rate (set-rate)
--       rate_pause     ms of server time until which the rate grants nothing
--       shadow         the recorded shadow limits: '', 'l', 'r' or 'lr' (see "Shadow limits")
--     the last of each sequence (see seq_after()), and the rate's schedule:
--       fence          the last fencing token
--       ticket         the last ticket in time (a new one is after it)
--       handover       the last handover token
--       tat            the rate's theoretical arrival time of the next grant, µs (GCRA)
--     the pace of the line:
--       released       permits released or reclaimed so far (a parked record's mark)
--       hold_ms        moving average of how long a permit is held
--       grant_at       ms of the last grant
--       grant_gap_ms   moving average of the ms between grants while others wait
--     counts of the records below, so a script reads them only while there are some:
--       n_parked, n_handed  parked records in state p, in state h (see "Parked records")
--       n_weighted     "w|<waiter>" records
--       n_fair_keys    "f|<key>" records
--     records (see "Weights" and "The order of the line"):
--       w|<waiter>     a waiter's weight text while it is in line, when not 1|1:
--                      "<k>|<j>[|<priority>[|<fair weight>|<fair key>]]"
--       f|<key>        a fair key's place in the rotation, while it has waiters:
--                      "<tail>|<waiting>|<urgent tail>|<grants>|<minute>|<grants the
--                      minute before>|<tie>" (fair_in())
--       fair_clock     the head of the line the last fair ticket started from
--       fair_low       the least urgent priority the line has seen (at most 0)
--       fair_joins     how many times a key joined the rotation (the keys' ties)
--       fair_grants    grants to fair waiters: "<this minute's>|<minute>|<the minute
--                      before's>" (fair_grants_in())
--     the expiry of the keys (see touch_due()):
--       expiry         ms when the last noted touch makes the keys expire
--       layout         a long value that keeps meta a hash table (see LAYOUT)
--     counters, which metrics.py exports (read by counts.lua and status.lua alone, but
--     the high-water mark m_shadow_peak, which acquire reads to raise it):
--       m_granted, m_refused, m_throttled, m_expired, m_abandoned, m_renewed, m_lost,
--       m_parked, m_handed_over, m_handover_retried, m_fair_granted_c<0..4> (by fair
--       weight class), m_shadow_limit, m_shadow_rate, m_shadow_wait_ms, m_shadow_peak,
--       and the histograms m_wait_b<0..11>, m_wait_sum, m_hold_b<0..11>, m_hold_sum
--       (see observe())
--   KEYS[7] parked   HASH  holder -> "<handover token>|<state>|<mark>|<payload>": a waiter
--                          that left its payload to be handed over when due, or one
--                          waiting in place (see "Parked records")
--   KEYS[8] handed   ZSET  holder -> when to hand it over (again), or forget its record
--   KEYS[9] sent     ZSET  holder -> when its task was published with a place in line
--                          (enqueue.lua), until it first asks or is released: so a task
--                          whose place lapsed while its message sat in the broker is
--                          still seen (status.lua); entries older than the sent horizon
--                          (an hour, at most the idle time) are dropped: a message the
--                          broker lost is not counted forever
--   KEYS[10] epoch HASH    one per Redis (per slot on a Cluster), no expiry: epoch,
--                          lost_ms, resumes_ms, restored (see "Data loss")
--
-- ARGV[#ARGV] (every script): "<epoch the caller knows, or ''>|<pause ms>" (see "Data
-- loss"; pause 0: a reader, status.lua).
--
-- Tickets and fencing tokens are max(last + 1, server time in µs): strictly
-- increasing even after the meta hash expired or Redis lost its data.
--
-- holders and hinfo hold the same members, and so do waiters, wexp and winfo:
-- each group is written and deleted together by one script, and touch() gives
-- all six keys the same expiry. So ZCARD waiters == 0 means that wexp and winfo
-- are absent too, which lets the hot paths skip the waiter keys entirely.

-- Several semaphores at once ------------------------------------------------------
--
-- acquire_all.lua takes the keys of n semaphores (n groups of the ten above, one epoch
-- hash) and grants a contender a permit on every one or on none: see its header.
-- use() points the helpers at one group. A contender asking that way is never marked
-- waiting in place (w): grant_in_place() would grant it one semaphore alone; so it
-- stops the in-place grants behind it in a line (FIFO), and asks again when woken.

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

-- Several semaphores in one call (acquire_all.lua): the prelude's helpers work on the
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

