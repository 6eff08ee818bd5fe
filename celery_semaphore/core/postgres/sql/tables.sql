-- The semaphores' tables (schema @T@), shared by every version of the functions.
-- A semaphore is one row of `semaphores` (what the Redis store keeps in its meta
-- hash); its holders and waiters are rows of their own, one per holder id, so a
-- second release of the same holder finds nothing to delete. Every operation locks
-- its semaphore's row first (SELECT ... FOR UPDATE): admission is serialised per
-- semaphore, never across semaphores.
-- Holder ids and names are compared byte by byte (COLLATE "C"), as Redis orders them.

CREATE SCHEMA IF NOT EXISTS @T@;

CREATE TABLE IF NOT EXISTS @T@.semaphores (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  namespace text COLLATE "C" NOT NULL,
  name text COLLATE "C" NOT NULL,
  family text NOT NULL DEFAULT '',
  recorded_limit integer,
  override integer,
  draining boolean NOT NULL DEFAULT false,
  -- The last fencing token and the last ticket (each max(last + 1, now µs)).
  fence bigint,
  ticket bigint,
  recorded_shadow text NOT NULL DEFAULT '',
  -- The rate the last acquirer declared and the operator's override (an interval in
  -- µs and a burst; NULL: none), GCRA's theoretical arrival time (µs), and until when
  -- a RateLimited pause lasts (ms).
  rate_interval_us bigint,
  rate_burst integer,
  override_interval_us bigint,
  override_burst integer,
  tat bigint,
  rate_pause_ms bigint,
  -- Fair share: the head the last fair ticket started from, how many keys joined the
  -- rotation (their ties), the least urgent priority seen, the fair grants this minute
  -- and the minute before (for status). fair_joins is written by count_fair() only.
  fair_clock bigint,
  fair_joins bigint NOT NULL DEFAULT 0,
  fair_low integer,
  fair_grants integer NOT NULL DEFAULT 0,
  fair_minute bigint NOT NULL DEFAULT 0,
  fair_grants_before integer NOT NULL DEFAULT 0,
  -- Permits released or reclaimed so far (a parked waiter's mark); the moving average
  -- of hold times (ms); the last handover token (max(last + 1, now µs)), moved on by
  -- dispatch_due() alone; whether a waiter ever asked for more than the default.
  released bigint NOT NULL DEFAULT 0,
  hold_ms bigint,
  handover bigint,
  weighted boolean NOT NULL DEFAULT false,
  -- Counters for the metrics; the grants a shadow limit would have refused, how late
  -- the shadow rate's slots were (ms, in all), the most permits held over a shadow limit.
  expired bigint NOT NULL DEFAULT 0,
  shadow_limit_refusals bigint NOT NULL DEFAULT 0,
  shadow_rate_refusals bigint NOT NULL DEFAULT 0,
  shadow_wait_ms bigint NOT NULL DEFAULT 0,
  shadow_peak bigint NOT NULL DEFAULT 0,
  -- Permits found lost (m_lost: by a renewal, or noted by a worker).
  lost_noted bigint NOT NULL DEFAULT 0,
  -- The other counters and the histograms' buckets, by the Redis store's meta field
  -- (m_granted, m_wait_b0...: model/counters.py).
  counters jsonb NOT NULL DEFAULT '{}',
  -- When it was last used (ms) and how long it may stay idle: past that, the next
  -- call finds it empty, as Redis lets a semaphore's keys expire.
  used_ms bigint NOT NULL,
  idle_ms bigint NOT NULL,
  UNIQUE (namespace, name)
) WITH (fillfactor = 50);  -- every call rewrites its row: room for HOT updates

-- Columns added after the table was first made (older installs get them here).
ALTER TABLE @T@.semaphores ADD COLUMN IF NOT EXISTS counters jsonb NOT NULL DEFAULT '{}';

-- When each semaphore goes idle: a new semaphore's first call drops a few that did.
CREATE INDEX IF NOT EXISTS semaphores_by_idle_end ON @T@.semaphores ((used_ms + idle_ms));

CREATE TABLE IF NOT EXISTS @T@.holders (
  semaphore bigint NOT NULL REFERENCES @T@.semaphores ON DELETE CASCADE,
  holder text COLLATE "C" NOT NULL,
  token bigint NOT NULL,
  acquired_ms bigint NOT NULL,
  expires_ms bigint NOT NULL,
  permits integer NOT NULL,
  info text NOT NULL DEFAULT '',
  PRIMARY KEY (semaphore, holder)
);
CREATE INDEX IF NOT EXISTS holders_by_expiry ON @T@.holders (semaphore, expires_ms);

CREATE TABLE IF NOT EXISTS @T@.waiters (
  semaphore bigint NOT NULL REFERENCES @T@.semaphores ON DELETE CASCADE,
  holder text COLLATE "C" NOT NULL,
  ticket bigint NOT NULL,
  expires_ms bigint NOT NULL,
  since_ms bigint NOT NULL,
  info text NOT NULL DEFAULT '',
  -- Its ask's text ('' the default) and the permits and rate grants it asks for.
  ask text NOT NULL DEFAULT '',
  permits integer NOT NULL DEFAULT 1,
  grants integer NOT NULL DEFAULT 1,
  -- Its fair key, if its ask has one (counted in fair_keys by the functions).
  fair_key text COLLATE "C",
  PRIMARY KEY (semaphore, holder)
);
CREATE INDEX IF NOT EXISTS waiters_in_line ON @T@.waiters (semaphore, ticket, holder);
CREATE INDEX IF NOT EXISTS waiters_by_expiry ON @T@.waiters (semaphore, expires_ms);

-- Parked records (model/parking.py, `Record`): a waiter that left its payload to be
-- handed over (p), its payload handed over with ``token`` (h), a tombstone (d: the copy
-- handed over last arrived; x: it was served, a copy on its way is stale), or a waiter
-- in place (w, ``mark``: the lease a release may grant it). A tombstone outlives its
-- waiter for an hour. ``due_ms``: when to hand it over again, or forget it (the
-- model's `Parking.handed`); NULL: not due.
CREATE TABLE IF NOT EXISTS @T@.parked (
  semaphore bigint NOT NULL REFERENCES @T@.semaphores ON DELETE CASCADE,
  holder text COLLATE "C" NOT NULL,
  token bigint NOT NULL DEFAULT 0,
  state "char" NOT NULL CHECK (state IN ('p', 'h', 'd', 'x', 'w')),
  mark bigint NOT NULL DEFAULT 0,
  payload text NOT NULL DEFAULT '',
  due_ms bigint,
  PRIMARY KEY (semaphore, holder)
);
CREATE INDEX IF NOT EXISTS parked_by_due ON @T@.parked (semaphore, due_ms, holder)
  WHERE due_ms IS NOT NULL;
-- The records that are not tombstones, by state: a release looks up the waiters in
-- place, status and the metrics count the parked and handed over, without reading the
-- tombstones (a busy semaphore keeps an hour of them: one per task handed over).
CREATE INDEX IF NOT EXISTS parked_live ON @T@.parked (semaphore, state, holder)
  WHERE state IN ('p', 'h', 'w');

-- A fair key's record while it has waiters (model.order.FairKey): where its next
-- waiter starts, and its next urgent one; its waiters; its grants this minute and the
-- one before; its tie (the order in which keys joined the rotation).
CREATE TABLE IF NOT EXISTS @T@.fair_keys (
  semaphore bigint NOT NULL REFERENCES @T@.semaphores ON DELETE CASCADE,
  key text COLLATE "C" NOT NULL,
  tail bigint NOT NULL DEFAULT 0,
  urgent_tail bigint NOT NULL DEFAULT 0,
  waiting integer NOT NULL DEFAULT 0,
  grants integer NOT NULL DEFAULT 0,
  minute bigint NOT NULL DEFAULT 0,
  grants_before integer NOT NULL DEFAULT 0,
  tie integer NOT NULL DEFAULT 0,
  PRIMARY KEY (semaphore, key)
);

-- Tasks published with a place that have not reached a worker yet.
CREATE TABLE IF NOT EXISTS @T@.sent (
  semaphore bigint NOT NULL REFERENCES @T@.semaphores ON DELETE CASCADE,
  holder text COLLATE "C" NOT NULL,
  sent_ms bigint NOT NULL,
  PRIMARY KEY (semaphore, holder)
);

-- The versions of the functions installed (one schema each), for the CLI.
CREATE TABLE IF NOT EXISTS @T@.versions (
  functions text PRIMARY KEY,
  installed_at timestamptz NOT NULL DEFAULT now()
);
