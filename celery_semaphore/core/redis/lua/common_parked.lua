-- common_parked.lua, of the prelude (see common_keys.lua): the records of KEYS[7] parked.
--
-- Parked records ---------------------------------------------------------------
--
-- "<handover token>|<state>|<mark>|<payload>" (parked_in()); no record: the waiter asks
-- itself.
--
--   from       to    by                              when
--   any        p     park.lua, enqueue.lua           it parks (token 0, mark: meta.released)
--   p          h     dispatch()                      it is due (see dispatch()): a new token
--   h          h     dispatch()                      not arrived by its deadline: a new token
--                                                    (mark: the token before, that copy
--                                                    may only be late)
--   p, h       h     claim.lua                       its message was taken for another's
--                                                    handover: that token (mark 0)
--   h          p, h  claim.lua                       its handover went to the message
--                                                    taken: p (mark 0), or h with the
--                                                    token of its mark (mark 0)
--   h          d     acquire.lua (arrival())         a copy handed over arrives (the first)
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
-- The mark: of p, meta.released when it parked (claim.lua's 0: its turn came already);
-- of h, the token of the copy handed over before (dispatch()), or 0; of w, the lease;
-- else 0.
-- n_parked and n_handed in meta count the p and h records.

local TOMBSTONE_MS = 3600000
local PARKED_RECORD = '^(%d+)|(%a)|(%d+)|(.*)$'
local COUNTED = {p = 'n_parked', h = 'n_handed'}

-- A parked record's token, state, mark and payload (nothing for no record).
local function parked_in(record)
  if not record then return nil end
  return string.match(record, PARKED_RECORD)
end

-- A parked record's state alone (nil for no record): recount() reads it at every write,
-- without copying the payload.
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
  if record then token, state = parked_in(record) end
  if state == nil or state == 'd' or state == 'w' then
    put_record(holder, token .. '|w|' .. fmt(lease_ms) .. '|', record)
  end
end

-- ``holder`` (whose record is ``record``) no longer waits in place.
local function unmark_in_place(holder, record)
  local token, state = parked_in(record)
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
  local token, state = parked_in(record)
  if state == 'h' then
    put_record(holder, token .. '|x|0|', record)
    redis.call('ZADD', handed, now_ms + TOMBSTONE_MS, holder)
  elseif state == 'p' then
    forget({holder}, {record})
  else
    unmark_in_place(holder, record)
  end
end

-- What a waiter presenting handover ``token`` is: 'valid' (the first copy to arrive
-- while it is handed over, whichever handover's: its record becomes a tombstone with
-- that token; a message moved out of a parking queue is the only copy, and a later
-- handover may have found nothing to move), 'again' (the copy that arrived, delivered
-- again, or no record: proceed as usual), or 'stale' (any other copy: drop it). See
-- arrival() in core/model/parking.py.
local function arrival(holder, token)
  local record = redis.call('HGET', parked, holder)
  if not record then return 'again' end
  local current, state = parked_in(record)
  if state == 'x' or (current ~= token and state ~= 'h') then return 'stale' end
  if current == token and (state == 'd' or state == 'w') then return 'again' end
  put_record(holder, token .. '|d|0|', record)
  redis.call('ZADD', handed, now_ms + TOMBSTONE_MS, holder)
  return 'valid'
end
