-- The semaphore's operations as PL/pgSQL functions (schema @F@, named after a hash of
-- this text, so two releases can run side by side during a rolling upgrade). Each
-- operation is one function call, one round trip, one transaction; it reads the
-- database's clock once (clock_timestamp()) and locks its semaphore's row first.
--
-- The rules are the reference model's (celery_semaphore/core/model/); each function
-- names the model method it follows, and the conformance suite (tests/conformance/)
-- drives this store and the model side by side, reply by reply.
--
-- A caller's rate comes as (interval µs, burst), NULLs for none; ``declares`` false:
-- the caller declares nothing (the model's NOTHING), so the recorded rate counts. A
-- caller that publishes handovers passes its `Dispatch` as ``cfg``: ARRAY[max_block
-- ms, deadline ms, lead ms] (NULL: it publishes none).
--
-- Replies are jsonb arrays, read by core/postgres/replies.py; the handovers an
-- operation made are [[holder, token, payload, delay ms]...].

CREATE SCHEMA IF NOT EXISTS @F@;

-- The database's clock in µs (read once per operation).
CREATE FUNCTION @F@.now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- The next ticket or fencing token: max(last + 1, now µs) (order.seq_after).
CREATE FUNCTION @F@.seq_after(last bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT greatest(coalesce(last, 0) + 1, now_us)
$$;

-- The metrics' counters (model/counters.py, `Counters`; the Redis store's meta m_*
-- fields): ``n`` more of ``field`` in a row's ``counters``.
-- Both are written to be inlined by the planner (a single expression, no call nested
-- in another's argument: an argument that is a call would be evaluated once per use),
-- and declared STABLE, as jsonb_build_object is: a function is inlined only where it is
-- declared no less volatile than what it calls. Not inlined, each call cost ~35 µs.
CREATE FUNCTION @F@.bump(c jsonb, field text, n bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN n > 0
    THEN c || jsonb_build_object(field, coalesce((c ->> field)::bigint, 0) + n)
    ELSE c END
$$;

-- One observation of ``ms`` in histogram ``kind`` (Counters.observe): the first bucket
-- whose bound is at least ``ms`` (else the last: the bucket's index is how many bounds
-- are below ``ms``, width_bucket's count of those at most ms - 1), and its sum. The
-- bounds are constants.HISTOGRAM_BOUNDS_MS, written in by schema.py.
CREATE FUNCTION @F@.observe(c jsonb, kind text, ms bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT c
    || jsonb_build_object('m_' || kind || '_b' || width_bucket(ms - 1, @BUCKETS@::bigint[]),
         coalesce((c ->> ('m_' || kind || '_b' || width_bucket(ms - 1, @BUCKETS@::bigint[])))
                  ::bigint, 0) + 1)
    || CASE WHEN ms >= 1
         THEN jsonb_build_object('m_' || kind || '_sum',
                                 coalesce((c ->> ('m_' || kind || '_sum'))::bigint, 0) + ms)
         ELSE '{}'::jsonb END
$$;

-- The channel a semaphore's waiters LISTEN on (core/postgres/listening.py names it too).
CREATE FUNCTION @F@.channel(ns text, nm text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'cs_' || md5(ns || '/' || nm)
$$;

-- The override if set, else the caller's declared limit, else the recorded one, else 0
-- (SemaphoreModel.effective_limit).
CREATE FUNCTION @F@.effective_limit(m @T@.semaphores, declared integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(m.override, declared, m.recorded_limit, 0)
$$;

-- (Functions that read tables or write are PL/pgSQL, which keeps their plans for the
-- session; a SQL-language function that cannot be inlined is planned at every call.)
CREATE FUNCTION @F@.permits_held(sem bigint) RETURNS integer LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (SELECT coalesce(sum(permits), 0)::integer FROM @T@.holders WHERE semaphore = sem);
END $$;

-- The rate in force (SemaphoreModel.effective_rate): the override if set, else the
-- caller's if it declares one, else the recorded one. NULLs: no rate.
CREATE FUNCTION @F@.effective_rate(
  m @T@.semaphores, declares boolean, di bigint, db integer,
  OUT interval_us bigint, OUT burst integer
) LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF m.override_interval_us IS NOT NULL THEN
    interval_us := m.override_interval_us;
    burst := m.override_burst;
  ELSIF declares THEN
    interval_us := di;
    burst := db;
  ELSE
    interval_us := m.rate_interval_us;
    burst := m.rate_burst;
  END IF;
END $$;

-- GCRA's theoretical arrival time as the next grant sees it (rate.rate_tat): an older
-- one than half an interval ago means the rate was idle, and it starts from now.
CREATE FUNCTION @F@.rate_tat(tat bigint, interval_us bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN coalesce(tat, 0) < now_us - interval_us / 2 THEN now_us
              ELSE coalesce(tat, 0) END
$$;

-- The grants the rate in force allows now (NULL: no rate, unbounded), and µs from now
-- until the first one after those (rate.rate_room): none while a pause lasts.
CREATE FUNCTION @F@.room(
  m @T@.semaphores, declares boolean, di bigint, db integer, now_us bigint,
  OUT grants bigint, OUT next_us bigint
) LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  r record;
  start bigint;
  pause_us bigint := coalesce(m.rate_pause_ms, 0) * 1000 - now_us;
BEGIN
  SELECT * INTO r FROM @F@.effective_rate(m, declares, di, db);
  next_us := 0;
  IF r.interval_us IS NULL THEN
    RETURN;
  END IF;
  IF pause_us > 0 THEN
    grants := 0;
    next_us := pause_us;
    RETURN;
  END IF;
  start := @F@.rate_tat(m.tat, r.interval_us, now_us);
  grants := greatest(0, floor((now_us + r.burst * r.interval_us - start)::numeric
                              / r.interval_us));
  next_us := start + (grants - r.burst + 1) * r.interval_us - now_us;
END $$;

-- µs from now until the rate allows a grant to a waiter whose grants and those ahead
-- add up to ``position`` (Room.slot_in).
CREATE FUNCTION @F@.slot_in(grants bigint, next_us bigint, interval_us bigint, position_ bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN grants IS NULL OR position_ <= grants THEN 0
              ELSE next_us + (position_ - grants - 1) * interval_us END
$$;

-- The semaphore's row, locked for this transaction; made if it is not there. One idle
-- past its idle time is dropped and made afresh (Backend.forget_idle: as Redis lets
-- the keys of an unused semaphore expire). ``create`` false: NULL when there is none.
-- Making one also drops up to 20 others idle past their time that nobody is using
-- (SKIP LOCKED: a semaphore in use is never waited for), so names used once (a key
-- function's) do not pile up.
CREATE FUNCTION @F@.open(ns text, nm text, idle bigint, now_ms bigint, create_ boolean)
RETURNS @T@.semaphores LANGUAGE plpgsql AS $$
DECLARE
  m @T@.semaphores;
BEGIN
  LOOP
    SELECT * INTO m FROM @T@.semaphores WHERE namespace = ns AND name = nm FOR UPDATE;
    IF FOUND AND now_ms - m.used_ms > m.idle_ms THEN
      DELETE FROM @T@.semaphores WHERE id = m.id;
      m := NULL;
    END IF;
    IF m.id IS NOT NULL OR NOT create_ THEN
      RETURN m;
    END IF;
    INSERT INTO @T@.semaphores (namespace, name, used_ms, idle_ms)
      VALUES (ns, nm, now_ms, idle)
      ON CONFLICT (namespace, name) DO NOTHING
      RETURNING * INTO m;
    IF FOUND THEN
      DELETE FROM @T@.semaphores WHERE id IN (
        SELECT id FROM @T@.semaphores WHERE used_ms + idle_ms < now_ms
        LIMIT 20 FOR UPDATE SKIP LOCKED);
      RETURN m;
    END IF;
  END LOOP;
END $$;

-- Writes back what an operation changed in the semaphore's row; it was used now
-- (used_ms moves at most once a second, or a quarter of the idle time if shorter, so
-- most writes leave the idle index alone and stay HOT updates).
CREATE FUNCTION @F@.save(m @T@.semaphores, now_ms bigint, idle bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE @T@.semaphores SET
    family = m.family, recorded_limit = m.recorded_limit, override = m.override,
    draining = m.draining, fence = m.fence, ticket = m.ticket,
    recorded_shadow = m.recorded_shadow, rate_interval_us = m.rate_interval_us,
    rate_burst = m.rate_burst, override_interval_us = m.override_interval_us,
    override_burst = m.override_burst, tat = m.tat, rate_pause_ms = m.rate_pause_ms,
    released = m.released, hold_ms = m.hold_ms,
    expired = m.expired, lost_noted = m.lost_noted, counters = m.counters,
    handover = m.handover,
    shadow_limit_refusals = m.shadow_limit_refusals,
    shadow_rate_refusals = m.shadow_rate_refusals, shadow_wait_ms = m.shadow_wait_ms,
    shadow_peak = m.shadow_peak, fair_clock = m.fair_clock, fair_low = m.fair_low,
    fair_grants = m.fair_grants, fair_minute = m.fair_minute,
    fair_grants_before = m.fair_grants_before,
    used_ms = CASE WHEN now_ms - m.used_ms >= least(1000, m.idle_ms / 4) THEN now_ms
                   ELSE m.used_ms END,
    idle_ms = greatest(coalesce(idle, m.idle_ms), 0)
  WHERE id = m.id;
END $$;

-- Fair share (model/order.py, SemaphoreModel.count_fair, put_fair, count_fair_grant) ----

-- ``delta`` more (or fewer) waiters of fair key ``k``: a record whose waiters are gone
-- is dropped (the key starts afresh when it comes back); a new one counts a join.
CREATE FUNCTION @F@.count_fair(sem bigint, k text, delta integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  f @T@.fair_keys;
BEGIN
  SELECT * INTO f FROM @T@.fair_keys WHERE semaphore = sem AND key = k;
  IF NOT FOUND THEN
    IF delta > 0 THEN
      INSERT INTO @T@.fair_keys (semaphore, key, waiting) VALUES (sem, k, delta);
      UPDATE @T@.semaphores SET fair_joins = fair_joins + 1 WHERE id = sem;
    END IF;
  ELSIF f.waiting + delta <= 0 THEN
    DELETE FROM @T@.fair_keys WHERE semaphore = sem AND key = k;
  ELSE
    UPDATE @T@.fair_keys SET waiting = f.waiting + delta WHERE semaphore = sem AND key = k;
  END IF;
END $$;

-- A waiter's ask changed from ``old_ask`` (its key ``old_key``) to ``new_ask``: its
-- keys' counts follow, and a semaphore that ever had a weighted waiter says so
-- (SemaphoreModel.weigh_waiter, unweigh; NULL asks: not in line).
CREATE FUNCTION @F@.weigh(sem bigint, old_ask text, old_key text, new_ask text, new_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(old_ask, '') = coalesce(new_ask, '') THEN
    RETURN;
  END IF;
  IF coalesce(new_ask, '') <> '' THEN
    UPDATE @T@.semaphores SET weighted = true WHERE id = sem AND NOT weighted;
  END IF;
  IF old_key IS NOT NULL THEN
    PERFORM @F@.count_fair(sem, old_key, -1);
  END IF;
  IF new_key IS NOT NULL THEN
    PERFORM @F@.count_fair(sem, new_key, 1);
  END IF;
END $$;

-- Grants of this minute and the minute before (order.recent).
CREATE FUNCTION @F@.recent(grants bigint, minute bigint, before bigint, now_ms bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN minute = now_ms / 60000 THEN grants + before
              WHEN minute = now_ms / 60000 - 1 THEN grants ELSE 0 END
$$;

-- A grant to a waiter of fair key ``k`` is counted per minute, in its key's record
-- (while it has one) and for all keys (SemaphoreModel.count_fair_grant), and in the
-- metrics by the class of its fair weight (the fourth field of its ask's text
-- ``ask_``, order.Asked.text; counters.weight_class).
CREATE FUNCTION @F@.count_fair_grant(m @T@.semaphores, k text, ask_ text, now_ms bigint)
RETURNS @T@.semaphores LANGUAGE plpgsql AS $$
DECLARE
  fw integer := coalesce(nullif(split_part(ask_, '|', 4), '')::integer, 1);
  f @T@.fair_keys;
  cur bigint := now_ms / 60000;
BEGIN
  IF k IS NULL THEN
    RETURN m;
  END IF;
  SELECT * INTO f FROM @T@.fair_keys WHERE semaphore = m.id AND key = k;
  IF NOT FOUND THEN
    RETURN m;
  END IF;
  IF f.minute <> cur THEN
    f.grants_before := CASE WHEN f.minute = cur - 1 THEN f.grants ELSE 0 END;
    f.grants := 0;
    f.minute := cur;
  END IF;
  IF f.waiting <= 0 THEN
    DELETE FROM @T@.fair_keys WHERE semaphore = m.id AND key = k;
  ELSE
    UPDATE @T@.fair_keys SET grants = f.grants + 1, minute = f.minute,
      grants_before = f.grants_before WHERE semaphore = m.id AND key = k;
  END IF;
  IF m.fair_minute <> cur THEN
    m.fair_grants_before := CASE WHEN m.fair_minute = cur - 1 THEN m.fair_grants ELSE 0 END;
    m.fair_grants := 0;
    m.fair_minute := cur;
  END IF;
  m.fair_grants := m.fair_grants + 1;
  m.counters := @F@.bump(m.counters,
    'm_fair_granted_c' || CASE WHEN fw >= 16 THEN 4 WHEN fw >= 8 THEN 3 WHEN fw >= 4 THEN 2
                               WHEN fw >= 2 THEN 1 ELSE 0 END, 1);
  RETURN m;
END $$;

-- Where a new ticket for an ask goes, without taking it (SemaphoreModel.place): the
-- next in time (``seq``), moved by priority; with a fair key, start-time fair queuing
-- (order.place_fair, fair_head): the key's record as it would be once taken.
CREATE FUNCTION @F@.place(
  m @T@.semaphores, priority integer, k text, weight integer, now_us bigint,
  OUT ticket bigint, OUT seq bigint, OUT head bigint, OUT low integer,
  OUT existed boolean, OUT tail bigint, OUT urgent_tail bigint, OUT tie integer
) LANGUAGE plpgsql AS $$
DECLARE
  anchor bigint;
  start bigint;
  turn float8;
  f @T@.fair_keys;
BEGIN
  seq := @F@.seq_after(m.ticket, now_us);
  IF k IS NULL THEN
    ticket := seq - priority * 1099511627776;
    RETURN;
  END IF;
  -- The head as the fair keys see it: the lowest ticket within half a priority step.
  anchor := greatest(seq, coalesce(m.fair_clock, 0));
  SELECT w.ticket INTO head FROM @T@.waiters w
    WHERE w.semaphore = m.id
      AND w.ticket BETWEEN anchor - 549755813888 AND anchor + 549755813888
    ORDER BY w.ticket, w.holder LIMIT 1;
  head := coalesce(head, seq);
  SELECT * INTO f FROM @T@.fair_keys WHERE semaphore = m.id AND key = k;
  existed := FOUND;
  IF NOT existed THEN
    f.tail := 0;
    f.urgent_tail := 0;
    SELECT (fair_joins + 1) % 1024 INTO f.tie FROM @T@.semaphores WHERE id = m.id;
  END IF;
  tie := f.tie;
  low := least(0, coalesce(m.fair_low, 0), priority);
  turn := 1048576::float8 / weight;
  IF priority > low THEN
    start := greatest(head, f.urgent_tail);
    urgent_tail := round(start + turn)::bigint;
    tail := round(greatest(head, f.tail) + turn)::bigint;
  ELSE
    start := greatest(head, f.tail);
    tail := round(start + turn)::bigint;
    urgent_tail := f.urgent_tail;
  END IF;
  ticket := start + f.tie;
END $$;

-- Takes the ticket `place` found (SemaphoreModel.new_ticket): the ticket sequence moves
-- on; with a fair key so do its record (kept though it has no waiter yet: the new one
-- is counted when it stands in line) and the fair clock.
CREATE FUNCTION @F@.take_ticket(
  m @T@.semaphores, k text, seq bigint, head bigint, low integer, existed boolean,
  tail bigint, urgent_tail bigint, tie integer
) RETURNS @T@.semaphores LANGUAGE plpgsql AS $$
BEGIN
  m.ticket := seq;
  IF k IS NOT NULL THEN
    INSERT INTO @T@.fair_keys AS f (semaphore, key, tail, urgent_tail, tie)
      VALUES (m.id, k, tail, urgent_tail, tie)
      ON CONFLICT (semaphore, key) DO UPDATE SET tail = excluded.tail,
        urgent_tail = excluded.urgent_tail;
    IF NOT existed THEN
      UPDATE @T@.semaphores SET fair_joins = fair_joins + 1 WHERE id = m.id;
    END IF;
    m.fair_clock := head;
    m.fair_low := low;
  END IF;
  RETURN m;
END $$;

-- Drops the holders and waiters whose leases ran out, and the lapsed waiters' parked
-- records (SemaphoreModel.reclaim): how many holders went and the permits they held,
-- how many waiters.
CREATE FUNCTION @F@.reclaim(
  sem bigint, now_ms bigint, OUT gone integer, OUT freed bigint, OUT lapsed integer
) LANGUAGE plpgsql AS $$
DECLARE
  k record;
BEGIN
  WITH d AS (
    DELETE FROM @T@.holders WHERE semaphore = sem AND expires_ms <= now_ms RETURNING permits
  ) SELECT count(*), coalesce(sum(permits), 0) INTO gone, freed FROM d;
  lapsed := 0;
  FOR k IN
    DELETE FROM @T@.waiters WHERE semaphore = sem AND expires_ms <= now_ms
      RETURNING holder, fair_key
  LOOP
    lapsed := lapsed + 1;
    DELETE FROM @T@.parked WHERE semaphore = sem AND holder = k.holder;
    IF k.fair_key IS NOT NULL THEN
      PERFORM @F@.count_fair(sem, k.fair_key, -1);
    END IF;
  END LOOP;
END $$;

-- Parked records (model/parking.py: `Parking`; the table `parked`) -------------------

-- How long a tombstone (d: arrived, x: served by another copy) is kept (TOMBSTONE_MS).
CREATE FUNCTION @F@.tombstone_ms() RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT 3600000::bigint
$$;

-- It no longer waits in place (Parking.unmark_in_place): a mark made on a tombstone
-- becomes that tombstone again (its token still tells a stale copy); any other goes.
CREATE FUNCTION @F@.unmark_in_place(sem bigint, h text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM @T@.parked WHERE semaphore = sem AND holder = h AND state = 'w' AND token = 0;
  IF NOT FOUND THEN
    UPDATE @T@.parked SET state = 'd', mark = 0, payload = ''
      WHERE semaphore = sem AND holder = h AND state = 'w';
  END IF;
END $$;

-- Refused while it waits in place (Parking.mark_in_place): a release may grant it a
-- permit of ``lease_ms`` directly. Only a waiter that asks itself is marked (no
-- record, a tombstone d whose token it keeps, or a mark already).
CREATE FUNCTION @F@.mark_in_place(sem bigint, h text, lease_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO @T@.parked AS p (semaphore, holder, state, mark) VALUES (sem, h, 'w', lease_ms)
    ON CONFLICT (semaphore, holder) DO UPDATE SET state = 'w', mark = excluded.mark,
      payload = '' WHERE p.state IN ('d', 'w');
END $$;

-- ``h`` got a permit without presenting a handover token (Parking.served): a copy
-- handed over and still on its way is stale from now (x, kept an hour to tell it so);
-- a parked payload is not needed any more; a mark in place goes.
CREATE FUNCTION @F@.served(sem bigint, h text, now_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  was "char";
BEGIN
  SELECT state INTO was FROM @T@.parked WHERE semaphore = sem AND holder = h;
  IF was = 'h' THEN
    UPDATE @T@.parked SET state = 'x', mark = 0, payload = '',
      due_ms = now_ms + @F@.tombstone_ms() WHERE semaphore = sem AND holder = h;
  ELSIF was = 'p' THEN
    DELETE FROM @T@.parked WHERE semaphore = sem AND holder = h;
  ELSIF was = 'w' THEN
    PERFORM @F@.unmark_in_place(sem, h);
  END IF;
END $$;

-- A copy presenting handover token ``tok`` asks (Parking.arrive, parking.arrival):
-- NULL to go on (the copy handed over last, whose record becomes a tombstone, or a
-- redelivery, or no record), else the token of the copy handed over last (a stale
-- copy: it changes nothing). While handed over, the first copy to arrive takes the
-- place, whichever handover's it is.
CREATE FUNCTION @F@.arrive(sem bigint, h text, tok bigint, now_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  r @T@.parked;
BEGIN
  SELECT * INTO r FROM @T@.parked WHERE semaphore = sem AND holder = h;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF r.state = 'x' OR (r.token <> tok AND r.state <> 'h') THEN
    RETURN r.token;
  END IF;
  IF r.token = tok AND r.state IN ('d', 'w') THEN
    RETURN NULL;
  END IF;
  UPDATE @T@.parked SET token = tok, state = 'd', mark = 0, payload = '',
    due_ms = now_ms + @F@.tombstone_ms() WHERE semaphore = sem AND holder = h;
  RETURN NULL;
END $$;

-- It parks (Parking.leave_payload): token 0, marked with the permits released so far,
-- due ``due_ms`` from now at the latest (0: only when its turn is near).
CREATE FUNCTION @F@.leave_payload(
  sem bigint, h text, payload_ text, released bigint, due_ms_ bigint, now_ms bigint
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO @T@.parked AS p (semaphore, holder, token, state, mark, payload, due_ms)
    VALUES (sem, h, 0, 'p', released, payload_,
            CASE WHEN due_ms_ > 0 THEN now_ms + due_ms_ END)
    ON CONFLICT (semaphore, holder) DO UPDATE SET token = 0, state = 'p',
      mark = excluded.mark, payload = excluded.payload, due_ms = excluded.due_ms;
END $$;

-- Hands ``h``'s payload over with token ``tok`` (Parking.hand_over), due again after
-- the deadline if it does not arrive; ``mark``: handed over again, the token of the
-- copy handed over before (it may only be late), else 0. The handover's reply row.
CREATE FUNCTION @F@.hand_over(
  sem bigint, h text, tok bigint, deadline bigint, delay_ms bigint, now_ms bigint,
  mark_ bigint
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  payload_ text;
BEGIN
  UPDATE @T@.parked SET token = tok, state = 'h', mark = mark_,
    due_ms = now_ms + delay_ms + deadline
    WHERE semaphore = sem AND holder = h RETURNING payload INTO payload_;
  RETURN jsonb_build_array(h, tok, payload_, delay_ms);
END $$;

-- A semaphore's row after a step, and the handovers the step made.
CREATE TYPE @F@.freed AS (m @T@.semaphores, handovers jsonb);

-- The parked waiters now due, handed over (after_free.dispatch, parking.window): for a
-- caller that publishes (``cfg``), among the first waiters of the line, a parked one
-- whose permits and grants, with those ahead, fit in the free permits and the rate's
-- room, or one parked before the latest release (the line moved); under a rate, the
-- first one past the rate's window is handed over with a delay that brings it at its
-- slot (at most the deadline ahead), and no one after it. Then those handed over that
-- did not arrive by their deadline (again, with a new token), and parked ones whose
-- due time came; a due record of one no longer in line (or an aged tombstone) is
-- forgotten. Only the limits that bind count (``codes``; NULL: the recorded ones).
-- The row (its counters) and the handovers, in the order made.
CREATE FUNCTION @F@.dispatch_due(
  m @T@.semaphores, cfg bigint[], declared integer, codes text, declares boolean,
  di bigint, db integer, now_us bigint
) RETURNS @F@.freed LANGUAGE plpgsql AS $$
DECLARE
  now_ms bigint := now_us / 1000;
  max_block bigint := cfg[1];
  deadline bigint := cfg[2];
  binding float8;
  room_grants bigint;  -- NULL: unbounded (no rate binds)
  room_next bigint := 0;
  interval_us bigint;
  room_left float8;
  free float8 := 0;
  near float8 := 0;
  permits float8;
  count_ float8;
  rate_window float8;
  paused_rate boolean;
  k bigint := 0;
  j bigint := 0;
  slot_ms bigint;
  progress boolean;
  last bigint;
  out_ jsonb := '[]';
  w record;
BEGIN
  IF cfg IS NULL OR NOT EXISTS (SELECT 1 FROM @T@.parked WHERE semaphore = m.id) THEN
    RETURN ROW(m, out_);
  END IF;
  last := m.handover;
  codes := coalesce(codes, m.recorded_shadow);
  binding := CASE WHEN position('l' IN codes) > 0 THEN 'Infinity'::float8
                  ELSE @F@.effective_limit(m, declared) END;
  IF position('r' IN codes) = 0 THEN
    SELECT r.grants, r.next_us INTO room_grants, room_next
      FROM @F@.room(m, declares, di, db, now_us) r;
  END IF;
  IF room_grants IS NOT NULL THEN
    SELECT r.interval_us INTO interval_us FROM @F@.effective_rate(m, declares, di, db) r;
  END IF;
  room_left := coalesce(room_grants::float8, 'Infinity'::float8);
  IF NOT m.draining THEN
    free := greatest(0, binding - @F@.permits_held(m.id));
    near := binding;
  END IF;
  IF coalesce(m.hold_ms, 0) > 0 AND binding < 'Infinity'::float8 THEN
    near := least(near, floor(max_block * binding / m.hold_ms));
  END IF;
  permits := free;
  free := least(free, room_left);
  count_ := free + near;
  rate_window := max_block;
  IF interval_us IS NOT NULL THEN
    rate_window := least(max_block, greatest(cfg[3], 3 * interval_us / 1000.0));
    count_ := least(count_, room_left + floor(rate_window * 1000 / interval_us) + 2);
  END IF;
  count_ := least(count_, 1000);
  paused_rate := interval_us IS NOT NULL AND coalesce(m.rate_pause_ms, 0) > now_ms;
  FOR w IN
    SELECT x.holder, x.permits, x.grants, p.state = 'p' AS parked, p.mark
    FROM @T@.waiters x LEFT JOIN @T@.parked p
      ON p.semaphore = x.semaphore AND p.holder = x.holder
    WHERE x.semaphore = m.id ORDER BY x.ticket, x.holder LIMIT floor(count_)::bigint
  LOOP
    k := k + w.permits;
    j := j + w.grants;
    progress := coalesce(w.parked, false) AND w.mark < m.released;
    slot_ms := 0;
    IF interval_us IS NOT NULL THEN
      slot_ms := ceil(@F@.slot_in(room_grants, room_next, interval_us, j) / 1000.0);
    END IF;
    IF slot_ms > rate_window OR paused_rate THEN
      IF w.parked AND (k <= permits OR progress) AND slot_ms <= deadline THEN
        last := @F@.seq_after(last, now_us);
        out_ := out_ || jsonb_build_array(
          @F@.hand_over(m.id, w.holder, last, deadline, slot_ms, now_ms, 0));
      END IF;
      EXIT;
    END IF;
    IF w.parked AND ((k <= permits AND j <= room_left) OR progress) THEN
      last := @F@.seq_after(last, now_us);
      out_ := out_ || jsonb_build_array(
        @F@.hand_over(m.id, w.holder, last, deadline, 0, now_ms, 0));
    END IF;
  END LOOP;
  FOR w IN
    SELECT p.holder, p.state, p.token, x.holder IS NOT NULL AS in_line
    FROM @T@.parked p LEFT JOIN @T@.waiters x
      ON x.semaphore = p.semaphore AND x.holder = p.holder
    WHERE p.semaphore = m.id AND p.due_ms <= now_ms ORDER BY p.due_ms, p.holder
  LOOP
    IF w.state IN ('h', 'p') AND w.in_line THEN
      m.counters := @F@.bump(m.counters, 'm_handover_retried', (w.state = 'h')::integer);
      last := @F@.seq_after(last, now_us);
      out_ := out_ || jsonb_build_array(@F@.hand_over(m.id, w.holder, last, deadline, 0,
        now_ms, CASE WHEN w.state = 'h' THEN w.token ELSE 0 END));
    ELSE
      DELETE FROM @T@.parked WHERE semaphore = m.id AND holder = w.holder;
    END IF;
  END LOOP;
  m.handover := last;
  m.counters := @F@.bump(m.counters, 'm_handed_over', jsonb_array_length(out_));
  RETURN ROW(m, out_);
END $$;

-- Free permits go straight to the waiters in place at the head of the line, in order,
-- each told on the channel, up to the first that is not waiting in place or needs more
-- permits or rate grants than are left (after_free.grant_in_place). Returns the row.
CREATE FUNCTION @F@.grant_in_place(
  m @T@.semaphores, declared integer, declares boolean, di bigint, db integer, now_us bigint
) RETURNS @T@.semaphores LANGUAGE plpgsql AS $$
DECLARE
  now_ms bigint := now_us / 1000;
  free integer;
  room bigint;
  spent bigint := 0;
  told boolean := false;
  r record;
  w record;
  fence bigint := m.fence;
BEGIN
  IF m.draining THEN
    RETURN m;
  END IF;
  free := @F@.effective_limit(m, declared) - @F@.permits_held(m.id);
  SELECT grants INTO room FROM @F@.room(m, declares, di, db, now_us);
  FOR w IN
    SELECT x.holder, x.permits, x.grants, p.mark AS in_place_ms, x.since_ms, x.info, x.fair_key,
      x.ask
    FROM @T@.waiters x LEFT JOIN @T@.parked p
      ON p.semaphore = x.semaphore AND p.holder = x.holder AND p.state = 'w'
    WHERE x.semaphore = m.id ORDER BY x.ticket, x.holder
  LOOP
    EXIT WHEN w.permits > free OR w.grants > room OR w.in_place_ms IS NULL;
    told := true;
    room := room - w.grants;
    spent := spent + w.grants;
    fence := @F@.seq_after(fence, now_us);
    m := @F@.count_fair_grant(m, w.fair_key, w.ask, now_ms);
    DELETE FROM @T@.waiters WHERE semaphore = m.id AND holder = w.holder;
    IF w.fair_key IS NOT NULL THEN
      PERFORM @F@.count_fair(m.id, w.fair_key, -1);
    END IF;
    PERFORM @F@.served(m.id, w.holder, now_ms);
    INSERT INTO @T@.holders AS x (semaphore, holder, token, acquired_ms, expires_ms, permits, info)
      VALUES (m.id, w.holder, fence, now_ms, now_ms + w.in_place_ms, w.permits, w.info)
      ON CONFLICT (semaphore, holder) DO UPDATE SET
        token = excluded.token, acquired_ms = excluded.acquired_ms,
        expires_ms = excluded.expires_ms, permits = excluded.permits, info = excluded.info;
    free := free - w.permits;
    PERFORM pg_notify(@F@.channel(m.namespace, m.name), concat_ws('|', 'g', w.holder,
      fence, now_ms + w.in_place_ms, now_ms - w.since_ms));
    m.counters := @F@.bump(m.counters, 'm_granted', 1);
    m.counters := @F@.observe(m.counters, 'wait', now_ms - w.since_ms);
  END LOOP;
  m.fence := fence;
  SELECT * INTO r FROM @F@.effective_rate(m, declares, di, db);
  IF told AND r.interval_us IS NOT NULL THEN
    m.tat := @F@.rate_tat(m.tat, r.interval_us, now_us) + spent * r.interval_us;
  END IF;
  RETURN m;
END $$;

-- Tells the blocked waiters that permits are free, with the highest ticket that may be
-- admitted now ('inf': any), so those further back sleep on (after_free.wake).
-- ``codes``: the shadow limits (NULL: the recorded ones).
CREATE FUNCTION @F@.wake(
  m @T@.semaphores, declared integer, codes text, declares boolean, di bigint, db integer,
  now_us bigint
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  free_permits integer;  -- NULL: no limit binds
  room bigint;  -- NULL: no rate binds
  j bigint := 0;
  line_length integer;
  free integer;
  listed integer;
  n integer := 0;
  k integer := 0;
  last bigint;
  w record;
BEGIN
  IF m.draining THEN
    RETURN;
  END IF;
  codes := coalesce(codes, m.recorded_shadow);
  IF position('l' IN codes) = 0 THEN
    free_permits := @F@.effective_limit(m, declared) - @F@.permits_held(m.id);
  END IF;
  IF position('r' IN codes) = 0 THEN
    SELECT grants INTO room FROM @F@.room(m, declares, di, db, now_us);
  END IF;
  free := least(free_permits, room);  -- least() passes over NULLs
  IF free_permits IS NULL THEN
    free := least(free, 1000);
  END IF;
  IF free <= 0 THEN
    RETURN;
  END IF;
  -- the line's length counts only up to free + 1 (a release must not read a long line)
  SELECT count(*) INTO line_length
    FROM (SELECT 1 FROM @T@.waiters WHERE semaphore = m.id LIMIT free + 1) x;
  IF line_length = 0 THEN
    RETURN;
  END IF;
  free := least(free, line_length + 1);
  FOR w IN
    SELECT ticket, permits, grants FROM @T@.waiters WHERE semaphore = m.id
    ORDER BY ticket, holder LIMIT free
  LOOP
    EXIT WHEN k + w.permits > free_permits OR j + w.grants > room;
    n := n + 1;
    k := k + w.permits;
    j := j + w.grants;
    last := w.ticket;
  END LOOP;
  listed := least(free, line_length);
  IF n = 0 THEN
    RETURN;
  END IF;
  PERFORM pg_notify(@F@.channel(m.namespace, m.name),
    CASE WHEN n = listed AND listed < free THEN 'inf' ELSE last::text END);
END $$;

-- What follows freed capacity (SemaphoreModel.after_free): the waiters in place granted,
-- the others woken, then the parked waiters now due handed over.
CREATE FUNCTION @F@.after_free(
  m @T@.semaphores, cfg bigint[], declared integer, codes text, declares boolean,
  di bigint, db integer, now_us bigint
) RETURNS @F@.freed LANGUAGE plpgsql AS $$
BEGIN
  m := @F@.grant_in_place(m, declared, declares, di, db, now_us);
  PERFORM @F@.wake(m, declared, codes, declares, di, db, now_us);
  RETURN @F@.dispatch_due(m, cfg, declared, codes, declares, di, db, now_us);
END $$;

-- One semaphore's part in one acquire (the model's `Gate`: admit.lua's ``s``): the
-- contender, the handover token it came by (NULL: it asks in person), what was reclaimed, its live permit, its place in line, the ticket it is
-- weighed at, then the judgement (`judge`) and whether it left the line.
CREATE TYPE @F@.gate AS (
  holder text, came_by bigint, reclaimed integer, held boolean, hold_permits integer, hold_acquired bigint,
  in_line boolean, w_since bigint, w_ask text, w_key text, ticket bigint,
  ahead integer, count_ integer, free integer, need_k integer, need_j integer, would text,
  admitted boolean, room_grants bigint, room_next bigint, rate_interval bigint,
  left_ boolean
);
-- A semaphore's row and its gate after a step, and the step's reply (if it has one).
CREATE TYPE @F@.gated AS (m @T@.semaphores, g @F@.gate, reply jsonb);

-- The start of an acquire (SemaphoreModel.open_gate): its task has reached a worker
-- (no longer sent); run-out leases are reclaimed; the caller's limit, rate and shadow
-- limits are recorded; asking in person drops a payload it parked; its place is its
-- own, or the ticket it presents if earlier.
CREATE FUNCTION @F@.open_gate(
  m @T@.semaphores, h text, presented bigint, came_by bigint, declared integer,
  shadow_ text, family_ text, rate_i bigint, rate_b integer, now_ms bigint
) RETURNS @F@.gated LANGUAGE plpgsql AS $$
DECLARE
  g @F@.gate;
  r record;
  hold @T@.holders;
  w @T@.waiters;
BEGIN
  DELETE FROM @T@.sent WHERE semaphore = m.id AND holder = h;
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  m.recorded_limit := declared;
  m.recorded_shadow := shadow_;
  m.rate_interval_us := rate_i;
  m.rate_burst := rate_b;
  IF family_ <> '' THEN
    m.family := family_;
  END IF;
  g.holder := h;
  g.came_by := came_by;
  g.reclaimed := r.gone + r.lapsed;
  g.left_ := false;
  SELECT * INTO hold FROM @T@.holders WHERE semaphore = m.id AND holder = h;
  g.held := FOUND;
  g.hold_permits := hold.permits;
  g.hold_acquired := hold.acquired_ms;
  SELECT * INTO w FROM @T@.waiters WHERE semaphore = m.id AND holder = h;
  g.in_line := FOUND;
  g.w_since := w.since_ms;
  g.w_ask := w.ask;
  g.w_key := w.fair_key;
  g.ticket := w.ticket;
  IF g.in_line AND came_by IS NULL THEN
    DELETE FROM @T@.parked WHERE semaphore = m.id AND holder = h AND state = 'p';
  END IF;
  IF presented IS NOT NULL AND (g.ticket IS NULL OR presented < g.ticket) THEN
    g.ticket := presented;
  END IF;
  RETURN ROW(m, g, NULL)::@F@.gated;
END $$;

-- Whether the semaphore admits the contender weighed at ``weigh_at`` (SemaphoreModel.judge):
-- a live holder always; else FIFO with weights (the weights ahead summed only while so
-- many could fit), the permits and the rate's grants must both fit; nobody new while
-- draining. A shadow limit that would refuse admits, and says so.
CREATE FUNCTION @F@.judge(
  m @T@.semaphores, g @F@.gate, weigh_at bigint, declared integer, shadow_ text,
  want_k integer, want_j integer, rate_i bigint, rate_b integer, now_us bigint
) RETURNS @F@.gate LANGUAGE plpgsql AS $$
DECLARE
  free integer;
  room record;
  rate record;
  by_limit boolean;
  by_rate boolean;
BEGIN
  SELECT count(*) INTO g.ahead FROM @T@.waiters WHERE semaphore = m.id AND ticket < weigh_at;
  g.count_ := @F@.permits_held(m.id);
  free := CASE WHEN m.draining THEN 0 ELSE @F@.effective_limit(m, declared) - g.count_ END;
  g.free := free;
  SELECT * INTO room FROM @F@.room(m, true, rate_i, rate_b, now_us);
  SELECT * INTO rate FROM @F@.effective_rate(m, true, rate_i, rate_b);
  g.room_grants := room.grants;
  g.room_next := room.next_us;
  g.rate_interval := rate.interval_us;
  g.need_k := g.ahead;
  g.need_j := g.ahead;
  IF g.ahead > 0 AND g.ahead < greatest(free, coalesce(room.grants, 0)) THEN
    SELECT sum(permits), sum(grants) INTO g.need_k, g.need_j FROM @T@.waiters
      WHERE semaphore = m.id AND ticket < weigh_at;
  END IF;
  g.need_k := g.need_k + want_k;
  g.need_j := g.need_j + want_j;
  by_limit := g.need_k <= free;
  by_rate := room.grants IS NULL OR g.need_j <= room.grants;
  g.would := '';
  IF NOT g.held AND NOT m.draining THEN
    IF NOT by_limit AND position('l' IN shadow_) > 0 THEN
      by_limit := true;
      g.would := 'l';
    END IF;
    IF NOT by_rate AND position('r' IN shadow_) > 0 THEN
      by_rate := true;
      g.would := g.would || 'r';
    END IF;
  END IF;
  g.admitted := g.held OR (by_limit AND by_rate);
  RETURN g;
END $$;

-- Grants the permit (SemaphoreModel.grant): a new fencing token every time, even to a
-- live holder asking again (same permits, same first grant, no rate spent); a waiter
-- leaves the line (served, unless it came by a handover: its record is a tombstone
-- already); the rate's schedule moves on by the grants it asked for.
-- Reply: [1, token, expires ms, now ms, waited ms, shadow codes, shadow late ms].
CREATE FUNCTION @F@.grant(
  m @T@.semaphores, g @F@.gate, lease_ms bigint, info_ text, want_k integer,
  want_j integer, now_us bigint
) RETURNS @F@.gated LANGUAGE plpgsql AS $$
DECLARE
  now_ms bigint := now_us / 1000;
  token bigint := @F@.seq_after(m.fence, now_us);
  waited bigint := 0;
  late_ms bigint := 0;
BEGIN
  m.fence := token;
  IF g.in_line THEN
    m := @F@.count_fair_grant(m, g.w_key, g.w_ask, now_ms);
    waited := now_ms - g.w_since;
    DELETE FROM @T@.waiters WHERE semaphore = m.id AND holder = g.holder;
    PERFORM @F@.weigh(m.id, g.w_ask, g.w_key, NULL, NULL);
    IF g.came_by IS NULL THEN
      PERFORM @F@.served(m.id, g.holder, now_ms);
    END IF;
  END IF;
  IF NOT g.held AND g.rate_interval IS NOT NULL THEN
    m.tat := @F@.rate_tat(m.tat, g.rate_interval, now_us) + want_j * g.rate_interval;
  END IF;
  INSERT INTO @T@.holders (semaphore, holder, token, acquired_ms, expires_ms, permits, info)
    VALUES (m.id, g.holder, token, CASE WHEN g.held THEN g.hold_acquired ELSE now_ms END,
            now_ms + lease_ms, CASE WHEN g.held THEN g.hold_permits ELSE want_k END, info_)
    ON CONFLICT (semaphore, holder) DO UPDATE SET
      token = excluded.token, acquired_ms = excluded.acquired_ms,
      expires_ms = excluded.expires_ms, permits = excluded.permits, info = excluded.info;
  m.counters := @F@.bump(m.counters, 'm_granted', 1);
  m.counters := @F@.observe(m.counters, 'wait', waited);
  IF position('l' IN g.would) > 0 THEN
    m.shadow_limit_refusals := m.shadow_limit_refusals + 1;
    m.shadow_peak := greatest(m.shadow_peak, g.count_ + coalesce(g.hold_permits, want_k));
  END IF;
  IF position('r' IN g.would) > 0 AND g.rate_interval IS NOT NULL THEN
    late_ms := ceil(@F@.slot_in(g.room_grants, g.room_next, g.rate_interval, g.need_j)
                    / 1000.0)::bigint;
    m.shadow_rate_refusals := m.shadow_rate_refusals + 1;
    m.shadow_wait_ms := m.shadow_wait_ms + late_ms;
  END IF;
  RETURN ROW(m, g, jsonb_build_array(1, token, now_ms + lease_ms, now_ms, waited, g.would,
                                    late_ms))::@F@.gated;
END $$;

-- A waiter stands in line (SemaphoreModel.stand_in_line, places.take_place): the first
-- of an empty line notifies 'k' on the channel, so the processes that keep permits
-- give them back (see "Kept permits" at release). ``in_line``: it is in line already.
CREATE FUNCTION @F@.stand_in_line(m @T@.semaphores, in_line boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT coalesce(in_line, false)
     AND NOT EXISTS (SELECT 1 FROM @T@.waiters WHERE semaphore = m.id) THEN
    PERFORM pg_notify(@F@.channel(m.namespace, m.name), 'k');
  END IF;
END $$;

-- Not granted (SemaphoreModel.refuse): queueing (``waiter_ms`` > 0), it stands in line
-- at ``place``, waiting in place for a permit of ``in_place_ms`` if given; the first
-- waiter of an empty line notifies 'k' (`stand_in_line`).
-- Reply: [0, ticket (0: not queued), position, permits held, effective limit,
-- draining, earliest lease end ms (0: none), now ms, average hold ms (0: none), µs
-- until the rate's slot (NULL: no rate), end of a RateLimited pause ms (0: none)].
CREATE FUNCTION @F@.refuse(
  m @T@.semaphores, g @F@.gate, place bigint, waiter_ms bigint, in_place_ms bigint,
  info_ text, ask_ text, want_k integer, want_j integer, fair_key_ text, declared integer,
  now_us bigint
) RETURNS @F@.gated LANGUAGE plpgsql AS $$
DECLARE
  now_ms bigint := now_us / 1000;
  earliest bigint;
BEGIN
  IF NOT g.admitted THEN  -- this semaphore refused it (not a set's other one)
    m.counters := @F@.bump(m.counters, 'm_refused', 1);
    m.counters := @F@.bump(m.counters, 'm_throttled', (g.need_k <= g.free)::integer);
  END IF;
  IF waiter_ms > 0 AND place IS NOT NULL THEN
    PERFORM @F@.stand_in_line(m, g.in_line);
    PERFORM @F@.weigh(m.id, CASE WHEN g.in_line THEN g.w_ask END, g.w_key, ask_, fair_key_);
    INSERT INTO @T@.waiters AS x (semaphore, holder, ticket, expires_ms, since_ms, info,
                                  ask, permits, grants, fair_key)
      VALUES (m.id, g.holder, place, now_ms + waiter_ms, now_ms, info_, ask_, want_k,
              want_j, fair_key_)
      ON CONFLICT (semaphore, holder) DO UPDATE SET
        ticket = excluded.ticket, expires_ms = excluded.expires_ms, info = excluded.info,
        ask = excluded.ask, permits = excluded.permits, grants = excluded.grants,
        fair_key = excluded.fair_key;
    IF in_place_ms IS NOT NULL THEN
      PERFORM @F@.mark_in_place(m.id, g.holder, in_place_ms);
    ELSIF g.in_line THEN
      PERFORM @F@.unmark_in_place(m.id, g.holder);
    END IF;
  ELSE
    place := 0;
  END IF;
  SELECT min(expires_ms) INTO earliest FROM @T@.holders WHERE semaphore = m.id;
  RETURN ROW(m, g, jsonb_build_array(0, place, g.ahead + 1, g.count_,
    @F@.effective_limit(m, declared), m.draining, coalesce(earliest, 0), now_ms,
    coalesce(m.hold_ms, 0),
    CASE WHEN g.rate_interval IS NOT NULL
      THEN @F@.slot_in(g.room_grants, g.room_next, g.rate_interval, g.need_j) END,
    CASE WHEN g.rate_interval IS NOT NULL AND coalesce(m.rate_pause_ms, 0) > now_ms
      THEN m.rate_pause_ms ELSE 0 END))::@F@.gated;
END $$;

-- Takes the contender out of this line (SemaphoreModel.leave_gate: a set's semaphore
-- that would admit it while another refuses).
CREATE FUNCTION @F@.leave_gate(m @T@.semaphores, g @F@.gate) RETURNS @F@.gate
LANGUAGE plpgsql AS $$
BEGIN
  IF g.in_line THEN
    PERFORM @F@.unmark_in_place(m.id, g.holder);
    DELETE FROM @T@.waiters WHERE semaphore = m.id AND holder = g.holder;
    PERFORM @F@.weigh(m.id, g.w_ask, g.w_key, NULL, NULL);
    g.left_ := true;
  END IF;
  RETURN g;
END $$;

-- The end of an acquire (SemaphoreModel.finish_gate): what follows freed capacity, if it
-- reclaimed anything or left a line; else, after a grant under a rate that binds, the
-- waiters of the next slots.
CREATE FUNCTION @F@.finish_gate(
  m @T@.semaphores, g @F@.gate, granted boolean, cfg bigint[], declared integer,
  shadow_ text, rate_i bigint, rate_b integer, now_us bigint
) RETURNS @F@.freed LANGUAGE plpgsql AS $$
BEGIN
  IF g.reclaimed > 0 OR g.left_ THEN
    RETURN @F@.after_free(m, cfg, declared, shadow_, true, rate_i, rate_b, now_us);
  END IF;
  IF granted AND g.room_grants IS NOT NULL AND position('r' IN shadow_) = 0 THEN
    RETURN @F@.dispatch_due(m, cfg, declared, shadow_, true, rate_i, rate_b, now_us);
  END IF;
  RETURN ROW(m, '[]'::jsonb);
END $$;

-- Take a permit, or take or keep a place in line; never blocks (SemaphoreModel.attempt).
-- ``came_by``: the token of the handed-over copy this is; a stale copy changes nothing.
-- A new contender is weighed where its new ticket would go, and takes it only if
-- refused while queueing. [grant()'s or refuse()'s reply, handovers], or [[2, token of
-- the copy handed over last], []] for a stale copy.
CREATE FUNCTION @F@.acquire(
  ns text, nm text, h text, declared integer, lease_ms bigint, waiter_ms bigint,
  presented bigint, info_ text, idle bigint, in_place boolean, family_ text,
  shadow_ text, ask_ text, want_k integer, want_j integer, priority integer,
  rate_i bigint, rate_b integer, fair_key_ text, fair_weight_ integer, came_by bigint,
  cfg bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  g @F@.gate;
  x @F@.gated;
  f @F@.freed;
  p record;
  place bigint;
  stale bigint;
BEGIN
  m := @F@.open(ns, nm, idle, now_ms, true);
  IF came_by IS NOT NULL THEN
    stale := @F@.arrive(m.id, h, came_by, now_ms);
    IF stale IS NOT NULL THEN
      RETURN jsonb_build_array(jsonb_build_array(2, stale), '[]'::jsonb);
    END IF;
  END IF;
  x := @F@.open_gate(m, h, presented, came_by, declared, shadow_, family_, rate_i, rate_b,
                     now_ms);
  m := x.m;
  g := x.g;
  SELECT * INTO p FROM @F@.place(m, priority, fair_key_, fair_weight_, now_us);
  g := @F@.judge(m, g, coalesce(g.ticket, p.ticket), declared, shadow_, want_k, want_j,
                 rate_i, rate_b, now_us);
  IF g.admitted THEN
    x := @F@.grant(m, g, lease_ms, info_, want_k, want_j, now_us);
  ELSE
    place := g.ticket;
    IF waiter_ms > 0 AND place IS NULL THEN
      m := @F@.take_ticket(m, fair_key_, p.seq, p.head, p.low, p.existed, p.tail,
                           p.urgent_tail, p.tie);
      place := p.ticket;
    END IF;
    x := @F@.refuse(m, g, place, waiter_ms, CASE WHEN in_place THEN lease_ms END, info_,
                    ask_, want_k, want_j, fair_key_, declared, now_us);
  END IF;
  f := @F@.finish_gate(x.m, g, g.admitted, cfg, declared, shadow_, rate_i, rate_b, now_us);
  PERFORM @F@.save(f.m, now_ms, idle);
  RETURN jsonb_build_array(x.reply, f.handovers);
END $$;

-- A permit of every semaphore of ``names`` at once, or none (model.joint.acquire_all):
-- each weighed as a lone attempt weighs it; all grant, or none does. Refused, it stands
-- in line with ONE ticket in every semaphore that refused it, and, for ``hold_ms``,
-- in those that would have admitted it. The rows are locked in name order first, so
-- two sets sharing semaphores never wait for each other in a circle.
-- ``came_by``: [the index (1-based) of the semaphore that handed it over, the token],
-- or NULL. [1, [grant()'s reply per semaphore], handovers per semaphore] or [0,
-- ticket, [indexes (0-based) that refused], [refuse()'s reply per semaphore],
-- handovers per semaphore], or [2, index (0-based), token of the copy handed over
-- last] for a stale copy. ``cfg_max``, ``cfg_deadline``, ``cfg_lead``: each
-- semaphore's `Dispatch` (NULLs: none).
CREATE FUNCTION @F@.acquire_all(
  ns text, names text[], h text, presented bigint, hold_ms bigint, info_ text,
  declared integer[], lease_ms bigint[], waiter_ms bigint[], idle bigint[],
  families text[], shadows text[], asks text[], want_k integer[], want_j integer[],
  priorities integer[], rate_i bigint[], rate_b integer[], fair_keys text[],
  fair_weights integer[], came_by bigint[], cfg_max bigint[], cfg_deadline bigint[],
  cfg_lead bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  n integer := cardinality(names);
  ms @T@.semaphores[];
  gs @F@.gate[];
  m @T@.semaphores;
  g @F@.gate;
  x @F@.gated;
  p record;
  fair integer;
  taken bigint;
  seq bigint := 0;
  placed bigint;
  admitted boolean := true;
  lease bigint;
  rows jsonb := '[]';
  refused_by jsonb := '[]';
  handed jsonb := '[]';
  f @F@.freed;
  cfg bigint[];
  stale bigint;
  k integer;
BEGIN
  FOR k IN SELECT u.i FROM unnest(names) WITH ORDINALITY AS u(name, i) ORDER BY u.name LOOP
    PERFORM @F@.open(ns, names[k], idle[k], now_ms, true);
  END LOOP;
  IF came_by IS NOT NULL THEN
    m := @F@.open(ns, names[came_by[1]], idle[came_by[1]], now_ms, true);
    stale := @F@.arrive(m.id, h, came_by[2], now_ms);
    IF stale IS NOT NULL THEN
      RETURN jsonb_build_array(2, came_by[1] - 1, stale);
    END IF;
  END IF;
  FOR i IN 1 .. n LOOP
    m := @F@.open(ns, names[i], idle[i], now_ms, true);
    x := @F@.open_gate(m, h, presented, CASE WHEN i = came_by[1] THEN came_by[2] END,
                       declared[i], shadows[i], families[i], rate_i[i], rate_b[i], now_ms);
    ms[i] := x.m;
    gs[i] := x.g;
    IF fair IS NULL AND fair_keys[i] IS NOT NULL THEN
      fair := i;
    END IF;
    seq := greatest(seq, @F@.seq_after((x.m).ticket, now_us));
  END LOOP;
  -- The one ticket (model.joint.one_ticket): the fair semaphore's place, else the
  -- smallest of its places and the one presented.
  IF fair IS NOT NULL THEN
    taken := (gs[fair]).ticket;
  ELSE
    SELECT min((gate).ticket) INTO taken FROM unnest(gs) AS gate;
  END IF;
  placed := taken;
  IF placed IS NULL AND fair IS NOT NULL THEN
    SELECT * INTO p FROM @F@.place(ms[fair], priorities[fair], fair_keys[fair],
                                   fair_weights[fair], now_us);
    placed := p.ticket;
  ELSIF placed IS NULL THEN
    placed := seq - priorities[1] * 1099511627776;
  END IF;
  FOR i IN 1 .. n LOOP
    gs[i] := @F@.judge(ms[i], gs[i], placed, declared[i], shadows[i], want_k[i], want_j[i],
                       rate_i[i], rate_b[i], now_us);
    admitted := admitted AND (gs[i]).admitted;
  END LOOP;
  IF NOT admitted AND taken IS NULL AND EXISTS (SELECT 1 FROM unnest(waiter_ms) w WHERE w > 0)
  THEN
    FOR i IN 1 .. n LOOP
      m := ms[i];
      IF i = fair THEN
        SELECT * INTO p FROM @F@.place(m, priorities[i], fair_keys[i], fair_weights[i], now_us);
        m := @F@.take_ticket(m, fair_keys[i], p.seq, p.head, p.low, p.existed, p.tail,
                             p.urgent_tail, p.tie);
      ELSE
        m.ticket := seq;
      END IF;
      ms[i] := m;
    END LOOP;
    taken := placed;
  END IF;
  FOR i IN 1 .. n LOOP
    m := ms[i];
    g := gs[i];
    IF admitted THEN
      x := @F@.grant(m, g, lease_ms[i], info_, want_k[i], want_j[i], now_us);
    ELSE
      lease := waiter_ms[i];
      IF g.admitted THEN
        lease := CASE WHEN waiter_ms[i] > 0 AND NOT g.held THEN hold_ms ELSE 0 END;
        IF lease = 0 THEN
          g := @F@.leave_gate(m, g);
        END IF;
      ELSE
        refused_by := refused_by || to_jsonb(i - 1);
      END IF;
      x := @F@.refuse(m, g, taken, lease, NULL, info_, asks[i], want_k[i], want_j[i],
                      fair_keys[i], declared[i], now_us);
    END IF;
    rows := rows || jsonb_build_array(x.reply);
    cfg := CASE WHEN cfg_max[i] IS NOT NULL
                THEN ARRAY[cfg_max[i], cfg_deadline[i], cfg_lead[i]] END;
    f := @F@.finish_gate(x.m, g, admitted, cfg, declared[i], shadows[i], rate_i[i],
                         rate_b[i], now_us);
    handed := handed || jsonb_build_array(f.handovers);
    PERFORM @F@.save(f.m, now_ms, idle[i]);
  END LOOP;
  IF admitted THEN
    RETURN jsonb_build_array(1, rows, handed);
  END IF;
  RETURN jsonb_build_array(0, coalesce(taken, 0), refused_by, rows, handed);
END $$;

-- Take a place in line without asking for a permit (places.take_place), counted as
-- sent until its holder first asks. With ``far_window_us`` (NULL: never), a place whose
-- turn is far is parked at once instead, its payload ``far_head`` || ticket ||
-- ``far_tail``: far when draining, or when the rate's slot is further than the window,
-- or when at least (free permits + limit) waiters are ahead (only the limits that bind
-- count); it then holds ``park_ms``, is not counted as sent, and what is due is handed
-- over. [ticket, position, permits held, effective limit, draining, µs until the rate's
-- slot (NULL: no rate), parked, handovers].
CREATE FUNCTION @F@.enqueue(
  ns text, nm text, h text, declared integer, waiter_ms bigint, info_ text, idle bigint,
  shadow_ text, ask_ text, want_k integer, want_j integer, priority integer,
  sent_horizon_ms bigint, rate_i bigint, rate_b integer, fair_key_ text, fair_weight_ integer,
  far_window_us bigint, far_head text, far_tail text, park_ms bigint, far_due_ms bigint,
  cfg bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  r record;
  w @T@.waiters;
  is_new boolean;
  ahead integer;
  grants_ahead bigint;
  held integer;
  binding float8;
  room record;
  rate record;
  slot bigint;
  p record;
  far boolean := false;
  handed jsonb := '[]';
  f @F@.freed;
BEGIN
  m := @F@.open(ns, nm, idle, now_ms, true);
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  IF m.recorded_limit IS NULL THEN
    m.recorded_limit := declared;
    IF shadow_ <> '' THEN
      m.recorded_shadow := shadow_;
    END IF;
  END IF;
  IF r.gone + r.lapsed > 0 THEN  -- it hands over nobody: a publisher calls it inside its publish
    m := (@F@.after_free(m, NULL, declared, shadow_, true, rate_i, rate_b, now_us)).m;
  END IF;
  SELECT * INTO w FROM @T@.waiters WHERE semaphore = m.id AND holder = h;
  is_new := NOT FOUND;
  IF is_new THEN
    SELECT * INTO p FROM @F@.place(m, priority, fair_key_, fair_weight_, now_us);
    m := @F@.take_ticket(m, fair_key_, p.seq, p.head, p.low, p.existed, p.tail,
                         p.urgent_tail, p.tie);
    PERFORM @F@.stand_in_line(m, false);
    INSERT INTO @T@.waiters (semaphore, holder, ticket, expires_ms, since_ms, info, ask,
                             permits, grants, fair_key)
      VALUES (m.id, h, p.ticket, now_ms + waiter_ms, now_ms, info_, ask_, want_k, want_j,
              fair_key_)
      RETURNING * INTO w;
    PERFORM @F@.weigh(m.id, NULL, NULL, ask_, fair_key_);
  ELSE
    PERFORM @F@.weigh(m.id, w.ask, w.fair_key, ask_, fair_key_);
    UPDATE @T@.waiters SET expires_ms = now_ms + waiter_ms, ask = ask_, permits = want_k,
      grants = want_j, fair_key = fair_key_
      WHERE semaphore = m.id AND holder = h;
  END IF;
  SELECT count(*), coalesce(sum(grants), 0) INTO ahead, grants_ahead FROM @T@.waiters
    WHERE semaphore = m.id AND ticket < w.ticket;
  SELECT * INTO rate FROM @F@.effective_rate(m, true, rate_i, rate_b);
  SELECT * INTO room FROM @F@.room(m, true, rate_i, rate_b, now_us);
  IF rate.interval_us IS NOT NULL THEN
    slot := @F@.slot_in(room.grants, room.next_us, rate.interval_us, grants_ahead + want_j);
  END IF;
  held := @F@.permits_held(m.id);
  IF far_window_us IS NOT NULL THEN
    binding := CASE WHEN position('l' IN shadow_) > 0 THEN 'Infinity'::float8
                    ELSE @F@.effective_limit(m, declared) END;
    far := coalesce(m.draining
      OR (room.grants IS NOT NULL AND position('r' IN shadow_) = 0 AND slot > far_window_us)
      OR ahead >= greatest(0, binding - held) + binding, false);
  END IF;
  IF far THEN
    UPDATE @T@.waiters SET expires_ms = now_ms + park_ms WHERE semaphore = m.id AND holder = h;
    DELETE FROM @T@.sent WHERE semaphore = m.id AND holder = h;
    PERFORM @F@.leave_payload(m.id, h, far_head || w.ticket || far_tail, m.released,
                              far_due_ms, now_ms);
    m.counters := @F@.bump(m.counters, 'm_parked', 1);
    f := @F@.dispatch_due(m, cfg, NULL, shadow_, true, rate_i, rate_b, now_us);
    m := f.m;
    handed := f.handovers;
  ELSIF is_new THEN
    DELETE FROM @T@.sent WHERE semaphore = m.id AND sent_ms <= now_ms - sent_horizon_ms;
    INSERT INTO @T@.sent (semaphore, holder, sent_ms) VALUES (m.id, h, now_ms)
      ON CONFLICT DO NOTHING;
  END IF;
  PERFORM @F@.save(m, now_ms, idle);
  RETURN jsonb_build_array(w.ticket, ahead + 1, held, @F@.effective_limit(m, declared),
    m.draining, slot, far, handed);
END $$;

-- Give a permit back (SemaphoreModel.release): [released 0/1 (2: kept), handovers].
-- Idempotent: a second release, an unknown or reclaimed holder, or a stale token
-- releases nothing. Without a token (by id) it also drops the holder's place in line
-- (and, while anyone waits, its parked record). ``unused``: the rate's grants to give
-- back with a permit whose task never started.
--
-- Kept permits (kept.keep): with ``keep_as`` ('' or NULL: none) and a token, the
-- permit held with exactly that token moves to holder ``keep_as`` (same token, permits
-- and lease end; first held now, ``keep_info`` beside it) when ``keep_as`` holds
-- nothing, nobody waits, admissions are not paused (draining), the permits held are
-- within the limit, and there is no rate (recorded or override) and no shadow limit
-- (the caller's or the recorded one); no counter moves. Else it is released as
-- without. The first waiter of an empty line notifies 'k' (stand_in_line), so the
-- processes give kept permits back.
CREATE FUNCTION @F@.release(
  ns text, nm text, h text, tok bigint, declared integer, shadow_ text, unused integer,
  cfg bigint[], keep_as text, keep_info text
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  r record;
  waiting boolean;  -- anyone in line
  hold @T@.holders;
  held boolean;
  released boolean;
  left_ boolean := false;
  gone_key text;
  rate record;
  handed jsonb := '[]';
  f @F@.freed;
BEGIN
  m := @F@.open(ns, nm, NULL, now_ms, false);
  IF m.id IS NULL THEN
    RETURN jsonb_build_array(0, handed);
  END IF;
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  waiting := EXISTS (SELECT 1 FROM @T@.waiters WHERE semaphore = m.id);
  SELECT * INTO hold FROM @T@.holders WHERE semaphore = m.id AND holder = h;
  held := FOUND;
  IF coalesce(keep_as, '') <> '' AND held AND hold.token = tok AND NOT waiting
     AND NOT m.draining AND coalesce(shadow_, '') = '' AND m.recorded_shadow = ''
     AND @F@.permits_held(m.id) <= @F@.effective_limit(m, declared)
     AND (SELECT interval_us FROM @F@.effective_rate(m, false, NULL, NULL)) IS NULL
     AND NOT EXISTS (SELECT 1 FROM @T@.holders WHERE semaphore = m.id AND holder = keep_as)
  THEN
    UPDATE @T@.holders SET holder = keep_as, acquired_ms = now_ms,
      info = coalesce(keep_info, '')
      WHERE semaphore = m.id AND holder = h;
    PERFORM @F@.save(m, now_ms, NULL);
    RETURN jsonb_build_array(2, handed);
  END IF;
  released := held AND (tok IS NULL OR hold.token = tok OR hold.token = 0);
  IF released THEN
    DELETE FROM @T@.holders WHERE semaphore = m.id AND holder = h;
    -- The moving average of hold times, as the model stores it (order.stored: a float
    -- rounded half to even, which round(float8) does).
    m.hold_ms := CASE WHEN m.hold_ms IS NULL THEN now_ms - hold.acquired_ms
      ELSE round(0.8::float8 * m.hold_ms + 0.2::float8 * (now_ms - hold.acquired_ms))::bigint
    END;
    m.released := m.released + hold.permits;
    m.counters := @F@.observe(m.counters, 'hold', now_ms - hold.acquired_ms);
    SELECT * INTO rate FROM @F@.effective_rate(m, false, NULL, NULL);
    IF unused > 0 AND rate.interval_us IS NOT NULL AND m.tat IS NOT NULL THEN
      m.tat := m.tat - unused * rate.interval_us;
    END IF;
  END IF;
  IF tok IS NULL THEN
    DELETE FROM @T@.sent WHERE semaphore = m.id AND holder = h;
    IF waiting THEN
      DELETE FROM @T@.waiters WHERE semaphore = m.id AND holder = h
        RETURNING fair_key INTO gone_key;
      left_ := FOUND;
      m.counters := @F@.bump(m.counters, 'm_abandoned', left_::integer);
      IF gone_key IS NOT NULL THEN
        PERFORM @F@.count_fair(m.id, gone_key, -1);
      END IF;
      DELETE FROM @T@.parked WHERE semaphore = m.id AND holder = h;
    END IF;
  END IF;
  IF (released OR r.gone + r.lapsed > 0 OR left_) AND waiting THEN
    f := @F@.after_free(m, cfg, declared, shadow_, false, NULL, NULL, now_us);
    m := f.m;
    handed := f.handovers;
  END IF;
  PERFORM @F@.save(m, now_ms, NULL);
  RETURN jsonb_build_array(released::integer, handed);
END $$;

-- Compare-and-extend (SemaphoreModel.renew): each holder still live with its token
-- (NULL: any) gets a lease of ``lease_ms`` from now; the others are lost.
-- [lease end ms, [holders lost], handovers].
CREATE FUNCTION @F@.renew(
  ns text, nm text, hs text[], toks bigint[], lease_ms bigint, cfg bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  r record;
  lost text[] := '{}';
  f @F@.freed;
  handed jsonb := '[]';
BEGIN
  m := @F@.open(ns, nm, NULL, now_ms, false);
  IF m.id IS NULL THEN
    RETURN jsonb_build_array(now_ms + lease_ms, to_jsonb(hs), handed);
  END IF;
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  FOR i IN 1 .. coalesce(cardinality(hs), 0) LOOP
    UPDATE @T@.holders SET expires_ms = now_ms + lease_ms
      WHERE semaphore = m.id AND holder = hs[i]
        AND (toks[i] IS NULL OR token = toks[i] OR token = 0);
    IF NOT FOUND THEN
      lost := lost || hs[i];
      -- permits found lost: m_lost, as note_lost counts them
      m.lost_noted := m.lost_noted + (toks[i] IS NOT NULL)::integer;
    END IF;
  END LOOP;
  m.counters := @F@.bump(m.counters, 'm_renewed',
                         coalesce(cardinality(hs), 0) - cardinality(lost));
  IF r.gone + r.lapsed > 0 THEN
    f := @F@.after_free(m, cfg, NULL, NULL, false, NULL, NULL, now_us);
    m := f.m;
    handed := f.handovers;
  END IF;
  PERFORM @F@.save(m, now_ms, NULL);
  RETURN jsonb_build_array(now_ms + lease_ms, to_jsonb(lost), handed);
END $$;

-- A runtime setting (SemaphoreModel.set_override, set_draining, set_rate_override,
-- pause_rate): [previous value or NULL, handovers]; then run-out leases are reclaimed and what
-- follows freed capacity happens (a raised limit or an ended drain admits at once).
-- ``value``: the override ('' clears), '1' or '' (draining), "<interval µs>|<burst>" or
-- '' (the rate override), ms (a pause: without a rate in force nothing happens).
-- ``rate_i``, ``rate_b``: the caller's rate (NULLs: it declares none).
CREATE FUNCTION @F@.configure(
  ns text, nm text, field text, value text, idle bigint, rate_i bigint, rate_b integer,
  cfg bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  declares boolean := rate_i IS NOT NULL;
  m @T@.semaphores;
  r record;
  rate record;
  previous text;
  f @F@.freed;
BEGIN
  m := @F@.open(ns, nm, idle, now_ms, true);
  IF field = 'override' THEN
    previous := m.override::text;
    m.override := nullif(value, '')::integer;
  ELSIF field = 'draining' THEN
    previous := CASE WHEN m.draining THEN '1' END;
    m.draining := value = '1';
  ELSIF field = 'rate_override' THEN
    previous := m.override_interval_us || '|' || m.override_burst;
    m.override_interval_us := nullif(split_part(value, '|', 1), '')::bigint;
    m.override_burst := nullif(split_part(value, '|', 2), '')::integer;
  ELSIF field = 'rate_pause' THEN
    SELECT * INTO rate FROM @F@.effective_rate(m, declares, rate_i, rate_b);
    IF rate.interval_us IS NULL THEN
      PERFORM @F@.save(m, now_ms, idle);
      RETURN jsonb_build_array(NULL, '[]'::jsonb);
    END IF;
    m.rate_pause_ms := greatest(now_ms + value::bigint, coalesce(m.rate_pause_ms, 0));
  ELSE
    RAISE EXCEPTION 'unknown setting %', field USING ERRCODE = '22023';
  END IF;
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  -- kept permits go back: they would start tasks past the new setting
  PERFORM pg_notify(@F@.channel(m.namespace, m.name), 'k');
  f := @F@.after_free(m, cfg, NULL, NULL, declares, rate_i, rate_b, now_us);
  PERFORM @F@.save(f.m, now_ms, idle);
  RETURN jsonb_build_array(previous, f.handovers);
END $$;

-- What an operator sees (reading.status); it changes nothing, so it reclaims nothing:
-- entries whose lease ran out are left out. At most ``most`` holders and waiters are
-- listed (the counts are of all). A semaphore not there reads as a new one would.
-- [now ms, recorded limit, override, effective limit, draining, permits held, waiters,
--  [[holder, token, acquired ms, expires ms, info, permits]...] by lease end,
--  [[waiter, ticket, since ms, expires ms, info, state]...] in line order,
--  parked count, handed-over count, sent count, [[holder, sent ms]...] sent without a place, shadow codes,
--  the rate in force [interval µs, burst] or NULL, the rate override (the same),
--  the rate's room, the next start ms, the end of a RateLimited pause ms (0: none),
--  shadow limit refusals, shadow rate refusals, shadow wait ms, shadow peak,
--  fair keys with waiters, fair grants (this minute and the one before), the busiest
--  ``fair_top`` keys [[key, waiting, grants]...]]. A waiter's row ends with its ask's
--  text while any fair key has waiters (else NULL).
CREATE FUNCTION @F@.status(
  ns text, nm text, declared integer, sent_horizon_ms bigint, most integer,
  rate_i bigint, rate_b integer, fair_top integer
) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  horizon bigint := now_ms - sent_horizon_ms;
  rate record;
  room record;
  keys integer;
BEGIN
  SELECT * INTO m FROM @T@.semaphores WHERE namespace = ns AND name = nm;
  IF NOT FOUND OR now_ms - m.used_ms > m.idle_ms THEN
    m := NULL;
    m.draining := false;
    m.recorded_shadow := '';
  END IF;
  SELECT * INTO rate FROM @F@.effective_rate(m, rate_i IS NOT NULL, rate_i, rate_b);
  SELECT * INTO room FROM @F@.room(m, rate_i IS NOT NULL, rate_i, rate_b, now_us);
  SELECT count(*) INTO keys FROM @T@.fair_keys WHERE semaphore = m.id;
  RETURN jsonb_build_array(
    now_ms, m.recorded_limit, m.override, @F@.effective_limit(m, declared), m.draining,
    (SELECT coalesce(sum(permits), 0) FROM @T@.holders
      WHERE semaphore = m.id AND expires_ms > now_ms),
    (SELECT count(*) FROM @T@.waiters WHERE semaphore = m.id AND expires_ms > now_ms),
    (SELECT coalesce(jsonb_agg(jsonb_build_array(holder, token, acquired_ms, expires_ms,
       info, permits) ORDER BY expires_ms, holder), '[]')
     FROM (SELECT * FROM @T@.holders WHERE semaphore = m.id AND expires_ms > now_ms
           ORDER BY expires_ms, holder LIMIT most) x),
    (SELECT coalesce(jsonb_agg(jsonb_build_array(x.holder, x.ticket, x.since_ms,
       x.expires_ms, x.info,
       CASE WHEN p.state IN ('p', 'h', 'w') THEN p.state::text ELSE '' END,
       CASE WHEN keys > 0 THEN x.ask END)
       ORDER BY x.ticket, x.holder), '[]')
     FROM (SELECT * FROM @T@.waiters WHERE semaphore = m.id AND expires_ms > now_ms
           ORDER BY ticket, holder LIMIT most) x
     LEFT JOIN @T@.parked p ON p.semaphore = m.id AND p.holder = x.holder),
    (SELECT count(*) FROM @T@.parked WHERE semaphore = m.id AND state = 'p'),
    (SELECT count(*) FROM @T@.parked WHERE semaphore = m.id AND state = 'h'),
    (SELECT count(*) FROM @T@.sent WHERE semaphore = m.id AND sent_ms >= horizon),
    (SELECT coalesce(jsonb_agg(jsonb_build_array(s.holder, s.sent_ms)
       ORDER BY s.sent_ms, s.holder), '[]')
     FROM (SELECT * FROM @T@.sent s WHERE s.semaphore = m.id AND s.sent_ms >= horizon
           AND NOT EXISTS (SELECT 1 FROM @T@.waiters w WHERE w.semaphore = m.id
                           AND w.holder = s.holder AND w.expires_ms > now_ms)
           ORDER BY s.sent_ms, s.holder LIMIT most) s),
    m.recorded_shadow,
    CASE WHEN rate.interval_us IS NOT NULL
      THEN jsonb_build_array(rate.interval_us, rate.burst) END,
    CASE WHEN m.override_interval_us IS NOT NULL
      THEN jsonb_build_array(m.override_interval_us, m.override_burst) END,
    CASE WHEN rate.interval_us IS NULL THEN 0 ELSE room.grants END,
    CASE WHEN rate.interval_us IS NULL THEN 0
      ELSE now_ms + ceil(room.next_us / 1000.0)::bigint END,
    CASE WHEN coalesce(m.rate_pause_ms, 0) > now_ms THEN m.rate_pause_ms ELSE 0 END,
    coalesce(m.shadow_limit_refusals, 0), coalesce(m.shadow_rate_refusals, 0),
    coalesce(m.shadow_wait_ms, 0), coalesce(m.shadow_peak, 0),
    keys,
    CASE WHEN keys > 0
      THEN @F@.recent(m.fair_grants, m.fair_minute, m.fair_grants_before, now_ms) ELSE 0 END,
    (SELECT coalesce(jsonb_agg(jsonb_build_array(key, waiting, grants)
       ORDER BY waiting DESC, grants DESC, key), '[]')
     FROM (SELECT key, waiting, @F@.recent(grants, minute, grants_before, now_ms) AS grants
           FROM @T@.fair_keys WHERE semaphore = m.id
           ORDER BY waiting DESC, grants DESC, key LIMIT fair_top) x));
END $$;

-- Parking and handover (places.park, SemaphoreModel.dispatch, claim) -----------------

-- Whether dispatch finds the semaphore's meta (SemaphoreModel.meta_found): any field
-- what follows freed capacity reads. A semaphore only parked on, never asked, has none.
CREATE FUNCTION @F@.meta_found(m @T@.semaphores) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT m.recorded_limit IS NOT NULL OR m.override IS NOT NULL OR m.draining
    OR m.fence IS NOT NULL OR m.released > 0 OR m.hold_ms IS NOT NULL
    OR m.handover IS NOT NULL OR m.rate_interval_us IS NOT NULL
    OR m.override_interval_us IS NOT NULL OR m.tat IS NOT NULL
    OR m.rate_pause_ms IS NOT NULL OR m.weighted OR m.recorded_shadow <> ''
$$;

-- Stay in line without asking: leave ``payload_`` to be handed over when due (maybe at
-- once), or ``due_ms_`` from now at the latest (places.park). The place is its own,
-- the ticket presented if earlier, or a new one; it holds ``park_ms``. ``ask_`` NULL
-- keeps the recorded ask (a new place then asks for the default). The caller declares
-- no limit. [ticket, position, handovers].
CREATE FUNCTION @F@.park(
  ns text, nm text, h text, presented bigint, payload_ text, park_ms bigint, info_ text,
  idle bigint, due_ms_ bigint, ask_ text, want_k integer, want_j integer,
  priority integer, fair_key_ text, fair_weight_ integer, cfg bigint[]
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  r record;
  w @T@.waiters;
  p record;
  place bigint;
  ahead integer;
  f @F@.freed;
BEGIN
  m := @F@.open(ns, nm, idle, now_ms, true);
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  SELECT * INTO w FROM @T@.waiters WHERE semaphore = m.id AND holder = h;
  place := w.ticket;
  IF presented IS NOT NULL AND (place IS NULL OR presented < place) THEN
    place := presented;
  END IF;
  IF place IS NULL THEN
    SELECT * INTO p FROM @F@.place(m, coalesce(priority, 0), fair_key_,
                                   coalesce(fair_weight_, 1), now_us);
    m := @F@.take_ticket(m, fair_key_, p.seq, p.head, p.low, p.existed, p.tail,
                         p.urgent_tail, p.tie);
    place := p.ticket;
  END IF;
  PERFORM @F@.stand_in_line(m, w.holder IS NOT NULL);  -- SemaphoreModel.stand_in_line
  IF ask_ IS NOT NULL THEN
    PERFORM @F@.weigh(m.id, w.ask, w.fair_key, ask_, fair_key_);
  END IF;
  INSERT INTO @T@.waiters AS x (semaphore, holder, ticket, expires_ms, since_ms, info, ask,
                                permits, grants, fair_key)
    VALUES (m.id, h, place, now_ms + park_ms, now_ms, info_, coalesce(ask_, ''),
            coalesce(want_k, 1), coalesce(want_j, 1), fair_key_)
    ON CONFLICT (semaphore, holder) DO UPDATE SET ticket = excluded.ticket,
      expires_ms = excluded.expires_ms, info = excluded.info,
      ask = coalesce(ask_, x.ask), permits = coalesce(want_k, x.permits),
      grants = coalesce(want_j, x.grants),
      fair_key = CASE WHEN ask_ IS NULL THEN x.fair_key ELSE excluded.fair_key END;
  DELETE FROM @T@.sent WHERE semaphore = m.id AND holder = h;
  PERFORM @F@.leave_payload(m.id, h, payload_, m.released, due_ms_, now_ms);
  m.counters := @F@.bump(m.counters, 'm_parked', 1);
  SELECT count(*) INTO ahead FROM @T@.waiters WHERE semaphore = m.id AND ticket < place;
  IF r.gone + r.lapsed > 0 THEN
    f := @F@.after_free(m, cfg, NULL, NULL, false, NULL, NULL, now_us);
  ELSE
    f := @F@.dispatch_due(m, cfg, NULL, NULL, false, NULL, NULL, now_us);
  END IF;
  PERFORM @F@.save(f.m, now_ms, idle);
  RETURN jsonb_build_array(place, ahead + 1, f.handovers);
END $$;

-- Hand over what is due, after dropping the named waiters that are parked or handed
-- over (revoked tasks; one asking in person or holding stays) (SemaphoreModel.dispatch).
-- A semaphore with no meta changes nothing. [how many were dropped, handovers].
CREATE FUNCTION @F@.dispatch(ns text, nm text, drop_ text[], cfg bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint := @F@.now_us();
  now_ms bigint := now_us / 1000;
  m @T@.semaphores;
  r record;
  k text;
  gone_key text;
  dropped integer := 0;
  f @F@.freed;
BEGIN
  m := @F@.open(ns, nm, NULL, now_ms, false);
  IF m.id IS NULL OR NOT @F@.meta_found(m) THEN
    RETURN jsonb_build_array(0, '[]'::jsonb);
  END IF;
  FOREACH k IN ARRAY coalesce(drop_, '{}') LOOP
    DELETE FROM @T@.parked WHERE semaphore = m.id AND holder = k AND state IN ('p', 'h');
    IF FOUND THEN
      dropped := dropped + 1;
      DELETE FROM @T@.waiters WHERE semaphore = m.id AND holder = k
        RETURNING fair_key INTO gone_key;
      IF gone_key IS NOT NULL THEN
        PERFORM @F@.count_fair(m.id, gone_key, -1);
      END IF;
      gone_key := NULL;
    END IF;
  END LOOP;
  m.counters := @F@.bump(m.counters, 'm_abandoned', dropped);
  r := @F@.reclaim(m.id, now_ms);
  m.released := m.released + r.freed;
  m.expired := m.expired + r.gone;
  IF r.gone + r.lapsed > 0 OR dropped > 0 THEN
    f := @F@.after_free(m, cfg, NULL, NULL, false, NULL, NULL, now_us);
  ELSE
    f := @F@.dispatch_due(m, cfg, NULL, NULL, false, NULL, NULL, now_us);
  END IF;
  PERFORM @F@.save(f.m, now_ms, NULL);
  RETURN jsonb_build_array(dropped, f.handovers);
END $$;

-- Who the message ``taken`` from a parking queue is, for the process that got the
-- handover (``handed``, ``tok``) (Parking.claim, SemaphoreModel.swap_tickets): 'absent'
-- (not parked: no record, or waiting in place), 'stale' (a copy arrived, or it was
-- served), 'void' (the handover is no longer ``handed``'s latest), else 'publish',
-- swapping when ``taken`` is another parked waiter: it takes the handover's token and
-- due time (and the earlier ticket); ``handed`` parks again (or, if an earlier copy of
-- it may still be on its way, is handed over with that copy's token). It frees
-- nothing, so it reclaims nothing and hands over nobody.
CREATE FUNCTION @F@.claim(ns text, nm text, taken text, handed text, tok bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  m @T@.semaphores;
  message @T@.parked;
  turn @T@.parked;
  mine @T@.waiters;
  theirs @T@.waiters;
BEGIN
  m := @F@.open(ns, nm, NULL, @F@.now_us() / 1000, false);
  IF m.id IS NULL THEN
    RETURN 'absent';
  END IF;
  SELECT * INTO message FROM @T@.parked WHERE semaphore = m.id AND holder = taken;
  IF NOT FOUND OR message.state = 'w' THEN
    RETURN 'absent';
  END IF;
  IF message.state IN ('d', 'x') THEN
    RETURN 'stale';
  END IF;
  SELECT * INTO turn FROM @T@.parked WHERE semaphore = m.id AND holder = handed;
  IF NOT FOUND OR turn.state <> 'h' OR turn.token <> tok THEN
    RETURN 'void';
  END IF;
  IF taken = handed THEN
    RETURN 'publish';
  END IF;
  UPDATE @T@.parked SET token = tok, state = 'h', mark = 0, due_ms = turn.due_ms
    WHERE semaphore = m.id AND holder = taken;
  UPDATE @T@.parked SET token = turn.mark, state = CASE WHEN turn.mark <> 0 THEN 'h' ELSE 'p' END,
    mark = 0 WHERE semaphore = m.id AND holder = handed;
  SELECT * INTO mine FROM @T@.waiters WHERE semaphore = m.id AND holder = taken;
  SELECT * INTO theirs FROM @T@.waiters WHERE semaphore = m.id AND holder = handed;
  IF mine.ticket > theirs.ticket THEN
    UPDATE @T@.waiters SET ticket = theirs.ticket WHERE semaphore = m.id AND holder = taken;
    UPDATE @T@.waiters SET ticket = mine.ticket WHERE semaphore = m.id AND holder = handed;
  END IF;
  RETURN 'publish';
END $$;
