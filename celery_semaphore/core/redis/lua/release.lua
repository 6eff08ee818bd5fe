-- release.lua: give a permit back; without a token, also leave the line.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's ReleaseArgs, read as ARGV[ARG.<name>]:
-- ARG.holder
-- ARG.token        fencing token, or '' to release whatever this holder holds and drop
--                  its place in line (the by-id release of a worker that lost the child)
-- ARG.idle_ms
-- ARG.channel
-- ARG.dispatch     '' or "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARG.declared     the caller's: what follows the release (after_free()) stays
--                  within it (see effective_limit())
-- ARG.unused       n > 0: the permit is given back unused (its task did not start:
--                  another of its limits refused it), so the n rate intervals its grant
--                  spent are given back too (its weight's grants: see "Rates" and
--                  "Weights" in common_weights.lua); '': it was used
-- ARG.shadow       the caller's shadow limits, as acquire.lua's ARG.shadow: what follows
--                  the release moves the line by the limits the caller enforces
-- ARG.keep_as      '' (release), or the holder id under which the task's process keeps
--                  the permit for its next task, where nobody waits (see below)
-- ARG.keep_info    the kept permit's info
--
-- Kept permits (SemaphoreModel.keep): with ARG.keep_as, the permit held with ARG.token
-- moves to that holder (same token, permits and lease end; first held now) when nobody
-- waits, admissions are not paused, the holders are within the limit, and there is no
-- rate and no shadow limit; else it is released as without. The first waiter of an
-- empty line publishes 'k' on the wake channel (stand_in_line()), so the processes give
-- kept permits back.
--
-- Keeps meta.hold_ms, a moving average of hold times (acquire reports it to waiters),
-- and counts m_abandoned: places in line given up (timeout, revoke).
-- Returns {released 0/1 (2: kept), held ms (0 if nothing released), handovers}: the
-- parked waiters now due (see dispatch()). Idempotent: a second release, an
-- unknown or expired holder, or a stale token releases nothing (a holder restored
-- by id after a data loss has token 0: any token releases it).

local holder, token, idle_ms = ARGV[ARG.holder], ARGV[ARG.token], tonumber(ARGV[ARG.idle_ms])
local channel, cfg = ARGV[ARG.channel], ARGV[ARG.dispatch]
local declared, unused = ARGV[ARG.declared], tonumber(ARGV[ARG.unused]) or 0
declared_shadow = ARGV[ARG.shadow]
local keep_as, keep_info = ARGV[ARG.keep_as], ARGV[ARG.keep_info]

local waiting = redis.call('ZCARD', waiters)
local reclaimed, lapsed = reclaim(nil, waiting)
if lapsed > 0 then waiting = redis.call('ZCARD', waiters) end
local m = load_meta({'hold_ms', 'rate', 'rate_override', 'tat', 'n_weighted', 'expiry', 'override',
  'limit', 'draining', 'shadow'}, waiting > 0)
local writes = {}  -- field, value, ...: one HSET of meta
local released, held_ms = 0, 0
local record = redis.call('HGET', hinfo, holder)
local current = token_of(record)
if keep_as ~= '' and current == token and waiting == 0 and not paused(m)
    and redis.call('ZCARD', holders) <= effective_limit(m, declared) and not effective_rate(m)
    and declared_shadow == '' and (m.shadow or '') == ''
    and redis.call('HEXISTS', hinfo, keep_as) == 0 then
  local permits = held_weight(record)
  local expires = redis.call('ZSCORE', holders, holder)
  redis.call('ZREM', holders, holder)
  vacate(holder, permits)
  redis.call('HDEL', hinfo, holder)
  occupy(keep_as, expires, permits)
  redis.call('HSET', hinfo, keep_as, holder_record(current, now_text, permits, keep_info))
  released = 2
elseif (token == '' or current == token or current == '0')
    and redis.call('ZREM', holders, holder) == 1 then
  redis.call('HDEL', hinfo, holder)
  local permits = held_weight(record)
  vacate(holder, permits)
  released = 1
  held_ms = now_ms - (tonumber(string.match(record or '', '^%d+|(%d+)')) or now_ms)
  local average = tonumber(m.hold_ms)
  writes = {'hold_ms', fmt(average and (0.8 * average + 0.2 * held_ms) or held_ms)}
  observe('hold', held_ms)
  count_released(m, permits)
  local rate = unused > 0 and effective_rate(m)
  if rate and m.tat then
    writes[#writes + 1] = 'tat'
    writes[#writes + 1] = fmt(tonumber(m.tat) - unused * rate.interval)
  end
end
local left = 0
if token == '' then
  redis.call('ZREM', sent, holder)  -- revoked before it asked
  if waiting > 0 then
    left = leave_line({holder}, 'forget', m)
    bump('m_abandoned', left)
  end
end
-- With nobody in line this call makes no key, and may skip the touch (touch_due()).
local touching = waiting > 0 or touch_due(m, idle_ms)
if touching then note_touch(writes, idle_ms, waiting > 0) end
if #writes > 0 then write_meta(m, writes) end
local out = {}
if (released == 1 or reclaimed > 0 or left > 0) and waiting > 0 then
  out = after_free(m, declared, channel, cfg)
end
if touching then touch(idle_ms, waiting == 0, true) end
return {released, held_ms, out}
