-- claim.lua: who the message taken from a parking queue is, for the process that got
-- a handover (ARG.handed, ARG.token) and took that queue's head (a broker queue hands
-- out its head only, in arrival order; the line hands over in ticket order). Where
-- the message is another parked waiter's, the turn goes to it (a swap), and the
-- waiter it was handed over to waits for the next: see Parking.claim in
-- celery_semaphore/core/model/parking.py, and "Parked records" in common_parked.lua.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's ClaimArgs, read as ARGV[ARG.<name>]:
-- ARG.taken        the task id of the message taken (X)
-- ARG.handed       the waiter the handover was for (H)
-- ARG.token        that handover's token (T)
--
-- Returns {code}, in this order of checks:
--   3 absent   X has no record, or waits in place (w): not parked here; the caller
--              publishes X's message without a token
--   2 stale    X's record is a tombstone (d, x): a copy arrived, or X was served; the
--              caller drops the message
--   0 void     H's record is not h with token T (handed over again, arrived, gone):
--              the caller puts the message back
--   1 publish  the caller publishes X's message with T. Where X is not H (X is p or
--              h): X becomes h with T (its payload, mark 0) at H's score in handed
--              (T's deadline); H becomes h with the token of its mark where it has
--              one (an earlier copy, handed over before, may still be on its way),
--              else p with mark 0 (due at the next release), at its score. Where X's
--              ticket is later than H's, they swap tickets too (X is served in H's
--              place when it arrives; both wait in one parking queue, so they are
--              of one account and priority).
-- Reads and writes KEYS[7] parked, KEYS[8] handed and the waiters' tickets alone, and
-- only for that swap:
-- it frees nothing, so it reclaims nothing and hands over nobody (nor restarts the
-- keys' expiry: those it writes exist).

local taken, handed_to, token = ARGV[ARG.taken], ARGV[ARG.handed], ARGV[ARG.token]

local message = redis.call('HGET', parked, taken)
local state = state_in(message)
if not state or state == 'w' then return {3} end
if state == 'd' or state == 'x' then return {2} end
local turn = message
if handed_to ~= taken then turn = redis.call('HGET', parked, handed_to) end
local current, turn_state, mark, payload = parked_in(turn)
if turn_state ~= 'h' or current ~= token then return {0} end
if handed_to == taken then return {1} end

local _, _, _, kept = parked_in(message)
put_record(taken, token .. '|h|0|' .. kept, message)
redis.call('ZADD', handed, redis.call('ZSCORE', handed, handed_to), taken)
if mark ~= '0' then
  put_record(handed_to, mark .. '|h|0|' .. payload, turn)
else
  put_record(handed_to, '0|p|0|' .. payload, turn)
end
local later, earlier = redis.call('ZSCORE', waiters, taken), redis.call('ZSCORE', waiters, handed_to)
if later and earlier and tonumber(later) > tonumber(earlier) then
  redis.call('ZADD', waiters, earlier, taken)
  redis.call('ZADD', waiters, later, handed_to)
end
return {1}
