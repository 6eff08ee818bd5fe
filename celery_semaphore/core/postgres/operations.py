"""The PostgreSQL store's side for the Celery side, the CLI and the metrics (synchronous;
`celery_semaphore.core.operations.OperatedStore`): plain reads of the tables
(``sql/tables.sql``), one query each, on the store's connection.

Nothing parks on PostgreSQL yet (`celery_semaphore.core.postgres.support`), so the
parked side answers "none": no parked semaphores, no parked tasks, no command to
hear. PostgreSQL keeps what it committed, so no loss of its data is ever noticed. A
semaphore idle past its idle time is gone, as the functions read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_semaphore.core.model.rate import Rate
from celery_semaphore.core.postgres._sync.store import PostgresStore
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
#: permits held, waiters, sent, rate interval µs, burst, paused until ms]...]]: tasks
#: sent within the sent horizon (`SemaphoreSpec.sent_horizon_ms`), the rate in force
#: for a caller that declares none (the override, else the recorded one).
COUNTS = f"""
SELECT jsonb_build_array(now.ms, coalesce(jsonb_agg(jsonb_build_array(
  m.name, m.recorded_limit, m.override, m.draining, m.family, m.expired, m.lost_noted,
  (SELECT coalesce(sum(h.permits), 0) FROM {TABLES}.holders h
    WHERE h.semaphore = m.id AND h.expires_ms > now.ms),
  (SELECT count(*) FROM {TABLES}.waiters w WHERE w.semaphore = m.id AND w.expires_ms > now.ms),
  (SELECT count(*) FROM {TABLES}.sent s
    WHERE s.semaphore = m.id AND s.sent_ms >= now.ms - least(m.idle_ms, {SENT_HORIZON_MS})),
  coalesce(m.override_interval_us, m.rate_interval_us),
  CASE WHEN m.override_interval_us IS NOT NULL THEN m.override_burst ELSE m.rate_burst END,
  CASE WHEN m.rate_pause_ms > now.ms THEN m.rate_pause_ms END
)) FILTER (WHERE m.id IS NOT NULL), '[]'))
FROM (SELECT {NOW_MS} AS ms) now
LEFT JOIN {TABLES}.semaphores m
  ON {LIVE_IN} AND m.name = ANY(%s::text[])
  AND m.recorded_limit IS NOT NULL
GROUP BY now.ms
"""
PERSISTENCE = (
    "SELECT jsonb_build_array(current_setting('fsync'), current_setting('synchronous_commit'))"
)


class Watching:
    """A subscription to a namespace's operators' commands: there are none to hear,
    as no task parks here (`PostgresOperatedStore.wake_workers`)."""

    def heard(self) -> bool:
        return False

    def close(self) -> None:
        """Nothing to close: it listens on no connection."""


class ParkedIndex:
    """The semaphores of a namespace with parked waiters: none, as no task parks here."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def forget_idle(self) -> None:
        """Nothing to forget."""


class PostgresOperatedStore(PostgresStore):
    """`PostgresStore` with the methods of
    `celery_semaphore.core.operations.OperatedStore` (see the module docstring)."""

    def __repr__(self) -> str:
        return f"PostgresOperatedStore({self.url!r})"

    def semaphore_names(self, namespace: str, *, parked: bool = False) -> list[str]:
        if parked:
            return []
        return list(self._one(NAMES, (namespace,)))

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
        return dict.fromkeys(names, 0)

    def recorded_families(self, namespace: str, names: Sequence[str]) -> list[str | None]:
        families = self._one(FAMILIES, (namespace, list(names)))
        return [families.get(name) or None for name in names]

    def recorded_rate(self, namespace: str, name: str) -> RateLimit | None:
        row = self._one(RECORDED_RATE, (namespace, name))
        if row is None or row[0] is None:
            return None
        return rate_limit(Rate(*row))

    def wake_workers(self, namespace: str, name: str) -> int:
        """No worker keeps tasks parked for a PostgreSQL semaphore: none to wake."""
        return 0

    def watch(self, namespace: str) -> Watching:
        return Watching()

    def last_data_loss(self, namespace: str) -> tuple[float, float, float]:
        """PostgreSQL keeps what it committed (its WAL): no loss is ever noticed."""
        return 0.0, 0.0, 0.0

    def parked_index(self, namespace: str) -> ParkedIndex:
        return ParkedIndex()

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
    (name, recorded, override, draining, family, expired, lost, held, waiting, sent,
     interval_us, burst, paused_until_ms) = row  # fmt: skip
    # the Redis store's ``meta`` counters a row keeps too (the metrics read them)
    kept = {"family": family, "m_expired": str(expired), "m_lost": str(lost)}
    return SemaphoreCounts(
        name=name,
        declared_limit=recorded,
        effective_limit=override if override is not None else recorded,
        draining=draining,
        holder_count=held,
        waiter_count=waiting,
        server_time=now_ms / 1000,
        parked_count=0,
        handed_over_count=0,
        sent_count=sent,
        rate=None if interval_us is None else rate_limit(Rate(interval_us, burst)),
        rate_paused_until=None if paused_until_ms is None else paused_until_ms / 1000,
        fair_keys_waiting=0,
        fields={field: kept.get(field, "") for field in fields},
    )
