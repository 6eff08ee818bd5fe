"""The PostgreSQL store's side for the Celery side, the CLI and the metrics (synchronous;
`celery_semaphore.core.operations.OperatedStore`): plain reads of the tables
(``sql/tables.sql``), one query each, on the store's connection.

The parked side reads the ``parked`` table. A semaphore has parked tasks while it has
records in state ``p`` (parked) or ``h`` (handed over, not arrived yet): those a
worker's heartbeat looks after (`celery_semaphore.worker.parked_look`), and those the
Redis store counts in ``n_parked`` and ``n_handed``. Tombstones (``d``, ``x``) and
waiters in place (``w``) need no worker: an aged tombstone goes at the next dispatch,
or with its semaphore; a waiter in place asks for itself. The worker's parked index is
that query (`ParkedIndex`): nothing to register, nothing to forget.

An operator's command reaches the workers by NOTIFY on one channel per namespace
(`watch_channel`), which each worker LISTENs on with a connection of its own (one more
per worker); that connection is named after the channel (``application_name``), so
`PostgresOperatedStore.wake_workers` counts the workers that heard it in
``pg_stat_activity``. PostgreSQL keeps what it committed, so no loss of its data is
ever noticed. A semaphore idle past its idle time is gone, as the functions read it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from celery_semaphore.core.constants import KEPT_PREFIX
from celery_semaphore.core.model.rate import Rate
from celery_semaphore.core.postgres._sync.store import PostgresStore
from celery_semaphore.core.postgres.connection import connect, needs_psycopg, translate
from celery_semaphore.core.postgres.schema import TABLES
from celery_semaphore.core.protocol import SENT_HORIZON
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.readings import rate_limit
from celery_semaphore.core.results import Persistence, SemaphoreCounts

#: The database's clock in ms, as the functions read it (``now_us()``).
NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
#: A semaphore of the namespace still there: used within its idle time.
LIVE_IN = "m.namespace = %s AND now.ms - m.used_ms <= m.idle_ms"
SEMAPHORES = f"{TABLES}.semaphores m, (SELECT {NOW_MS} AS ms) now"
SENT_HORIZON_MS = int(SENT_HORIZON * 1000)

NAMES = (
    f"SELECT coalesce(jsonb_agg(m.name ORDER BY m.name), '[]') FROM {SEMAPHORES} WHERE {LIVE_IN}"
)
#: Records of a semaphore's parked tasks: parked, or handed over and not arrived yet.
HAS_PARKED = (
    f"EXISTS (SELECT 1 FROM {TABLES}.parked p WHERE p.semaphore = m.id AND p.state IN ('p', 'h'))"
)
PARKED_NAMES = (
    f"SELECT coalesce(jsonb_agg(m.name ORDER BY m.name), '[]') FROM {SEMAPHORES} "
    f"WHERE {LIVE_IN} AND {HAS_PARKED}"
)
#: {name: tasks parked, not yet handed over}: as n_parked in the Redis store's meta.
PARKED_COUNTS = (
    f"SELECT coalesce(jsonb_object_agg(m.name, (SELECT count(*) FROM {TABLES}.parked p "
    f"WHERE p.semaphore = m.id AND p.state = 'p')), '{{}}') FROM {SEMAPHORES} "
    f"WHERE {LIVE_IN} AND m.name = ANY(%s::text[])"
)
RECORDED_LIMIT = (
    f"SELECT jsonb_build_array(m.recorded_limit, m.override) FROM {SEMAPHORES} "
    f"WHERE {LIVE_IN} AND m.name = %s"
)
RECORDED_RATE = (
    f"SELECT jsonb_build_array(m.rate_interval_us, m.rate_burst) FROM {SEMAPHORES} "
    f"WHERE {LIVE_IN} AND m.name = %s"
)
FAMILIES = (
    f"SELECT coalesce(jsonb_object_agg(m.name, m.family), '{{}}') FROM {SEMAPHORES} "
    f"WHERE {LIVE_IN} AND m.name = ANY(%s::text[])"
)
#: [now ms, [[name, recorded limit, override, draining, family, expired, lost noted,
#: permits held, waiters, parked, handed over, sent, rate interval µs, burst, paused
#: until ms, fair keys with waiters, the shadow counters (limit refusals, rate
#: refusals, rate wait ms, peak), the other counters]...]]: tasks sent within the sent horizon
#: (`SemaphoreSpec.sent_horizon_ms`), the rate in force for a caller that declares none
#: (the override, else the recorded one).
COUNTS = f"""
SELECT jsonb_build_array(now.ms, coalesce(jsonb_agg(jsonb_build_array(
  m.name, m.recorded_limit, m.override, m.draining, m.family, m.expired, m.lost_noted,
  (SELECT coalesce(sum(h.permits), 0) FROM {TABLES}.holders h
    WHERE h.semaphore = m.id AND h.expires_ms > now.ms),
  (SELECT count(*) FROM {TABLES}.waiters w WHERE w.semaphore = m.id AND w.expires_ms > now.ms),
  (SELECT count(*) FROM {TABLES}.parked p WHERE p.semaphore = m.id AND p.state = 'p'),
  (SELECT count(*) FROM {TABLES}.parked p WHERE p.semaphore = m.id AND p.state = 'h'),
  (SELECT count(*) FROM {TABLES}.sent s
    WHERE s.semaphore = m.id AND s.sent_ms >= now.ms - least(m.idle_ms, {SENT_HORIZON_MS})),
  coalesce(m.override_interval_us, m.rate_interval_us),
  CASE WHEN m.override_interval_us IS NOT NULL THEN m.override_burst ELSE m.rate_burst END,
  CASE WHEN m.rate_pause_ms > now.ms THEN m.rate_pause_ms END,
  (SELECT count(*) FROM {TABLES}.fair_keys f WHERE f.semaphore = m.id),
  m.shadow_limit_refusals, m.shadow_rate_refusals, m.shadow_wait_ms, m.shadow_peak,
  m.counters,
  (SELECT coalesce(sum(h.permits), 0) FROM {TABLES}.holders h
    WHERE h.semaphore = m.id AND h.expires_ms > now.ms AND starts_with(h.holder, '{KEPT_PREFIX}'))
)) FILTER (WHERE m.id IS NOT NULL), '[]'))
FROM (SELECT {NOW_MS} AS ms) now
LEFT JOIN {TABLES}.semaphores m
  ON {LIVE_IN} AND m.name = ANY(%s::text[])
  AND m.recorded_limit IS NOT NULL
GROUP BY now.ms
"""
#: Notify the workers of a namespace (``%s``: the channel, the semaphore's name); how
#: many listen (their watch connections, named after the channel, in this database).
WAKE = (
    "SELECT (SELECT count(*) FROM pg_stat_activity a WHERE a.application_name = %s "
    "AND a.datname = current_database()) FROM pg_notify(%s, %s)"
)
PERSISTENCE = (
    "SELECT jsonb_build_array(current_setting('fsync'), current_setting('synchronous_commit'))"
)


def watch_channel(namespace: str) -> str:
    """The channel the workers of ``namespace`` LISTEN on for operators' commands (an
    identifier of at most 63 bytes, whatever the namespace)."""
    return "cs_watch_" + hashlib.md5(namespace.encode()).hexdigest()


class Watching:
    """A connection of its own that LISTENs on a namespace's `watch_channel`:
    `heard()` says whether an operator's command came since the last look. A broken
    connection raises from `heard()`; the watch then makes a new one, and beats once
    for what it may have missed (`celery_semaphore.worker.watch`)."""

    def __init__(self, target: str, url: str, namespace: str) -> None:
        self._url = url
        channel = watch_channel(namespace)
        self._connection = connect(target)
        try:
            self._connection.execute("SELECT set_config('application_name', %s, false)", (channel,))
            self._connection.execute(f'LISTEN "{channel}"')
        except needs_psycopg().Error as error:
            self._connection.close()
            raise translate(error, url) from error

    def heard(self) -> bool:
        """Whether a notification came; never blocks."""
        try:
            return bool(list(self._connection.notifies(timeout=0)))
        except needs_psycopg().Error as error:
            raise translate(error, self._url) from error

    def close(self) -> None:
        self._connection.close()


class ParkedIndex:
    """The semaphores of a namespace with parked tasks, read now
    (`PostgresOperatedStore.semaphore_names` with ``parked``)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def forget_idle(self) -> None:
        """Nothing to forget: the index is a query of the ``parked`` table, so a
        semaphore leaves it with its last parked task."""


class PostgresOperatedStore(PostgresStore):
    """`PostgresStore` with the methods of
    `celery_semaphore.core.operations.OperatedStore` (see the module docstring)."""

    def __repr__(self) -> str:
        return f"PostgresOperatedStore({self.url!r})"

    def semaphore_names(self, namespace: str, *, parked: bool = False) -> list[str]:
        """Every live semaphore of ``namespace``, sorted; ``parked``: those with parked
        tasks (records ``p`` or ``h``)."""
        return list(self._one(PARKED_NAMES if parked else NAMES, (namespace,)))

    def recorded_limit(
        self, namespace: str, name: str, *, override_only: bool = False
    ) -> int | None:
        row = self._one(RECORDED_LIMIT, (namespace, name))
        if row is None:
            return None
        declared, override = row
        limit = declared if declared is not None or not override_only else override
        return None if limit is None else int(limit)

    def counts(
        self, namespace: str, names: Sequence[str], fields: Sequence[str] = ()
    ) -> list[SemaphoreCounts]:
        """The counts of each of ``names`` that exists and has a recorded limit, in the
        order of ``names``: one query for them all. Of the ``meta`` ``fields``, the
        family and the counters a row keeps (`COUNTERS`); the others read ''."""
        now_ms, rows = self._one(COUNTS, (namespace, list(names)))
        found = {row[0]: row for row in rows}
        return [_counts(found[name], now_ms, fields) for name in names if name in found]

    def parked_counts(self, namespace: str, names: Sequence[str]) -> dict[str, int]:
        """How many tasks each of ``names`` keeps parked, not yet handed over (``p``;
        0 for a semaphore not there), as the Redis store counts them."""
        found = self._one(PARKED_COUNTS, (namespace, list(names)))
        return {name: int(found.get(name, 0)) for name in names}

    def recorded_families(self, namespace: str, names: Sequence[str]) -> list[str | None]:
        families = self._one(FAMILIES, (namespace, list(names)))
        return [families.get(name) or None for name in names]

    def recorded_rate(self, namespace: str, name: str) -> RateLimit | None:
        row = self._one(RECORDED_RATE, (namespace, name))
        if row is None or row[0] is None:
            return None
        return rate_limit(Rate(*row))

    def wake_workers(self, namespace: str, name: str) -> int:
        """Tell every worker's heartbeat to beat now for ``name`` (NOTIFY on the
        namespace's `watch_channel`): after an operator's change, the parked tasks it
        made due are handed over at once, not at the next beat. How many workers
        listen."""
        channel = watch_channel(namespace)
        return int(self._one(WAKE, (channel, channel, name)))

    def watch(self, namespace: str) -> Watching:
        """Listen for operators' commands to the workers of ``namespace``."""
        return Watching(self.target, self.url, namespace)

    def last_data_loss(self, namespace: str) -> tuple[float, float, float]:
        """PostgreSQL keeps what it committed (its WAL): no loss is ever noticed."""
        return 0.0, 0.0, 0.0

    def parked_index(self, namespace: str) -> ParkedIndex:
        """The semaphores of ``namespace`` with parked tasks, read now."""
        return ParkedIndex(self.semaphore_names(namespace, parked=True))

    def ping(self) -> None:
        self._one("SELECT 1", ())

    def eviction_policy(self) -> str | None:
        """PostgreSQL drops no row of its own accord."""
        return None

    def persistence(self) -> Persistence:
        """Every committed write survives a crash unless ``fsync`` or
        ``synchronous_commit`` is off."""
        fsync, synchronous_commit = self._one(PERSISTENCE, ())
        every_write = fsync == "on" and synchronous_commit != "off"
        return Persistence(every_write, f"fsync {fsync}, synchronous_commit {synchronous_commit}")


def _counts(row: list[Any], now_ms: int, fields: Sequence[str]) -> SemaphoreCounts:
    (name, recorded, override, draining, family, expired, lost, held, waiting, parked,
     handed, sent, interval_us, burst, paused_until_ms, fair_keys, shadow_limit,
     shadow_rate, shadow_wait_ms, shadow_peak, counters, kept_permits) = row  # fmt: skip
    # the Redis store's ``meta`` counters a row keeps too (the metrics read them)
    kept = {
        **{field: str(n) for field, n in counters.items()},
        "family": family,
        "m_expired": str(expired),
        "m_lost": str(lost),
        "m_shadow_limit": str(shadow_limit),
        "m_shadow_rate": str(shadow_rate),
        "m_shadow_wait_ms": str(shadow_wait_ms),
        "m_shadow_peak": str(shadow_peak),
    }
    return SemaphoreCounts(
        name=name,
        declared_limit=recorded,
        effective_limit=override if override is not None else recorded,
        draining=draining,
        holder_count=held,
        waiter_count=waiting,
        server_time=now_ms / 1000,
        parked_count=parked,
        handed_over_count=handed,
        sent_count=sent,
        rate=None if interval_us is None else rate_limit(Rate(interval_us, burst)),
        rate_paused_until=None if paused_until_ms is None else paused_until_ms / 1000,
        fair_keys_waiting=fair_keys,
        kept_count=kept_permits,
        fields={field: kept.get(field, "") for field in fields},
    )
