-- common_epoch.lua, of the prelude (see common_keys.lua): the epoch of the data, and
-- begin(), which every call runs first.
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

-- nil if the caller presents the current epoch (and resumes_ms is set while paused);
-- else the reply that tells it the current one.
local function settle_epoch()
  local known, pause_ms = string.match(ARGV[EPOCH_ARG] or '', '^(%d*)|(%d+)$')
  if not known then return redis.error_reply('ERR celery_semaphore: no epoch argument') end
  local found = redis.call('HMGET', epoch_key, 'epoch', 'lost_ms', 'resumes_ms')
  local epoch, lost_ms, resumes = found[1], tonumber(found[2]) or 0, tonumber(found[3]) or 0
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
