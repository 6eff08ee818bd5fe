-- common_meta.lua, of the prelude (see common_keys.lua): the meta hash (its fields: see
-- KEYS[6] there), the effective limit, the sequences, the histograms, the idle expiry.
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

-- The records meta keeps besides its fields (weights, fair keys: see KEYS[6]), read
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
-- data loss (see "Data loss").
local function paused(m)
  return m.draining == '1' or resumes_ms > 0
end

-- The one rule (see above). ``declared``: the caller's limit, or '' for none.
local function effective_limit(m, declared)
  return tonumber(m.override) or tonumber(declared) or tonumber(m.limit) or 0
end

-- The next fence, ticket or handover token after ``last`` (a meta field's value, if any).
local function seq_after(last)
  return math.max((tonumber(last) or 0) + 1, now_us)
end

-- One observation of ``ms`` in histogram ``kind`` ('wait' or 'hold'): buckets
-- m_<kind>_b<i> are not cumulative; metrics.py adds them up. BUCKETS (the bounds, ms)
-- and HISTOGRAMS (each bucket's field, written out: making the names on each call
-- cost more than the two HINCRBYs) come from celery_semaphore/core/constants.py.
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
-- note: another process may declare a shorter idle time). A call that skips it creates
-- no key, or expires those it creates itself (a first holder) no sooner than the noted
-- touch, so every key of the semaphore expires between 15/16 of the idle time and the
-- idle time after its last use.
-- touch_due(): whether this call must touch; note_touch(): adds the record (and
-- meta.layout: see LAYOUT) to ``writes`` ({field, value, ...}), which the caller writes
-- to meta BEFORE it touches (so a meta that the write creates expires too).
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
