"""Prometheus metrics, computed from the store at scrape time: one cluster-wide view.

The store keeps counters and histogram buckets with each semaphore (Redis: its
``meta`` hash's ``m_*`` fields; PostgreSQL: the row's ``counters``; what counts
what is the reference model's, `celery_semaphore.core.model.counters`), so any
process can serve the same numbers, whichever worker did the work. Serve them
with ``celery worker --semaphore-metrics-port 9808`` (any one worker is enough;
every worker that serves them shows the same series), or from your own process
with `serve()` or by registering `SemaphoreCollector`. Needs the ``prometheus``
extra. Counters restart from zero when a semaphore's keys (or row) expire while
idle.

A scrape lists the semaphores (Redis: SCAN), then reads each with one counts.lua
call, pipelined (PostgreSQL: one query for them all): counters and counts, no entry
of a line read one by one, so its cost grows with the number of semaphores, not
with their lines (see docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .core.constants import HISTOGRAM_BOUNDS_MS, HISTOGRAMS, histogram_fields
from .core.operations import operated_store

#: Upper bounds (seconds) of the wait and hold histograms: the scripts' (ms).
BUCKETS = tuple(bound / 1000 for bound in HISTOGRAM_BOUNDS_MS)
OUTCOMES = {"m_granted": "granted", "m_refused": "refused", "m_abandoned": "abandoned"}


#: The gauges of each series: the metric's name (after the prefix; its key in a row), its help.
GAUGES = (
    ("holders", "Permits in use by live holders (a task of weight k uses k)."),
    ("kept_permits",
     "Of holders, the permits worker processes keep between tasks (semaphore_keep_idle): "
     "idle, or running the process's next task of the semaphore."),
    ("limit", "Effective limit (of a family: the sum of its members')."),
    ("waiters", "Live places in line."),
    ("draining", "1 while draining."),
    ("parked", "Waiting tasks parked in Redis until their turn."),
    ("handed_over", "Parked tasks published for their turn, not yet at a worker."),
    ("sent", "Tasks published with a place in line, not at a worker yet (in the broker)."),
    ("members",
     "Semaphores in this series: 1, or the live members of a key function's family."),
    ("rate_paused_seconds",
     "Seconds left of a pause of the rate after a task raised RateLimited "
     "(0: none; of a family: the longest)."),
    ("fair_keys_waiting",
     "Fair keys (fair_key=) with waiters in line (of a family: summed over its members)."),
    ("shadow_limit_peak",
     "The most permits held at once over a shadow concurrency limit (shadow=True): the peak "
     "it would have had to allow (0: never over; of a family: its highest member's)."),
)  # fmt: skip
#: The gauge of the effective rate: only for a series with a rate (no sample otherwise).
RATE = (
    "rate_per_second",
    "Starts per second the effective rate allows (the override if set; of a family: the sum "
    'of its members\' rates). Starts: acquire_attempts_total{outcome="granted"}.',
)
#: The counters besides the attempts by outcome: the ``meta`` field, the name, the help.
COUNTED = (
    ("m_parked", "parks", "Tasks parked."),
    ("m_handed_over", "handovers", "Parked tasks handed over (published)."),
    ("m_handover_retried", "handover_retries",
     "Handed-over tasks published again after their deadline."),
    ("m_renewed", "lease_renewals", "Leases renewed."),
    ("m_lost", "permits_lost",
     "Permits lost while their task ran (found gone by a worker's heartbeat)."),
    ("m_expired", "leases_expired", "Permits reclaimed after their lease ran out."),
    ("m_throttled", "throttled",
     "Refusals by the rate: a permit was free, but the rate allowed no start yet."),
    ("m_shadow_limit", "shadow_limit_refusals",
     "Grants a shadow concurrency limit (shadow=True: counted, never enforced) would have "
     "refused: the limit was full."),
    ("m_shadow_rate", "shadow_rate_refusals",
     "Grants a shadow rate (shadow=True) would have delayed: they came before their slot."),
    ("m_shadow_wait_ms", "shadow_rate_delay_seconds",
     "How long a shadow rate would have delayed those grants, in all."),
)  # fmt: skip
#: The grants to waiters of a fair key, by the key's fair weight: the ``meta`` counter
#: of each class (common_order.lua's weight_class()), its ``weight_class`` label. Only for a
#: series that has had a fair line (a key waiting now, or a grant counted).
FAIR_GRANTS = {
    "m_fair_granted_c0": "1",
    "m_fair_granted_c1": "2-3",
    "m_fair_granted_c2": "4-7",
    "m_fair_granted_c3": "8-15",
    "m_fair_granted_c4": "16+",
}
#: Gauges of the last loss of the Redis's data (read from its epoch hash, see
#: celery_semaphore.core.redis.epochs; on a Cluster, of its slots: the latest loss, the
#: longest pause, the permits written back summed): name, help.
DATA_LOSS = (
    ("data_lost_timestamp_seconds",
     "When a client last noticed that the semaphores' Redis lost its data (0: never)."),
    ("data_loss_pause_seconds",
     "How long admissions were paused after that loss (no permit granted)."),
    ("data_loss_permits_restored",
     "Permits of running tasks the workers wrote back after that loss."),
)  # fmt: skip
#: Counter fields of the ``meta`` hash, and the buckets and sums of the histograms.
COUNTERS = (
    *OUTCOMES, *(field for field, _, _ in COUNTED), *FAIR_GRANTS,
    *(field for kind in HISTOGRAMS for field in histogram_fields(kind)),
    *(f"m_{kind}_sum" for kind in HISTOGRAMS),
)  # fmt: skip
#: The ``meta`` fields a scrape reads of each semaphore besides its counts.
FIELDS = ("family", "m_shadow_peak", *COUNTERS)


class SemaphoreCollector:
    """A prometheus_client collector reading every semaphore of one namespace.

    The semaphores of one key function (a family, see
    `celery_semaphore.per_key`) are summed into one series labelled with the
    family's name, so a semaphore per customer does not make a series per
    customer; ``per_key=True`` shows each one. A family's counters stay
    monotonic while this collector lives: when a member's keys expire (idle),
    its last counts are kept in this process and still added in (the series of
    a semaphore on its own goes when its keys go, and restarts from zero).
    """

    def __init__(self, client: Any, namespace: str, url: str = "", per_key: bool = False) -> None:
        #: ``client``: a redis-py client (``url``: what it was made from) or a store.
        self.store = operated_store(client, url)
        self.namespace = namespace
        self.per_key = per_key
        self._members: dict[str, tuple[str, dict[str, float]]] = {}  # name: (series, counts)
        self._retired: dict[str, dict[str, float]] = {}  # series: counts of expired members

    def describe(self) -> list[Any]:
        return []

    def read(self) -> dict[str, dict[str, float]]:
        """Every series (semaphore or family name): its gauges, counters and
        ``members`` (how many semaphores it sums)."""
        series: dict[str, dict[str, float]] = {}
        seen: dict[str, tuple[str, dict[str, float]]] = {}
        names = self.store.semaphore_names(self.namespace)
        # one counts.lua call each (pipelined), with the meta fields it needs, not
        # HGETALL: meta also holds a record per weighted or fair waiter and per fair key
        for status in self.store.counts(self.namespace, names, FIELDS):
            name = status.name
            label = name if self.per_key else status.fields["family"] or name
            counts = {field: float(status.fields[field] or 0) for field in COUNTERS}
            seen[name] = (label, counts)
            row = series.setdefault(label, _zeros())
            row["holders"] += status.holder_count
            row["kept_permits"] += status.kept_count
            row["limit"] += status.effective_limit
            row["waiters"] += status.waiter_count
            row["draining"] = max(row["draining"], 1.0 if status.draining else 0.0)
            row["parked"] += status.parked_count
            row["handed_over"] += status.handed_over_count
            row["sent"] += status.sent_count
            row["members"] += 1
            row["fair_keys_waiting"] += status.fair_keys_waiting
            peak = float(status.fields["m_shadow_peak"] or 0)
            row["shadow_limit_peak"] = max(row["shadow_limit_peak"], peak)
            if status.rate is not None:
                row["rated"] += 1
                row["rate_per_second"] += status.rate.count / status.rate.per
                paused = (status.rate_paused_until or 0.0) - status.server_time
                row["rate_paused_seconds"] = max(row["rate_paused_seconds"], round(paused, 3))
            for field, value in counts.items():
                row[field] += value
        for name, (label, counts) in self._members.items():
            now = seen.get(name)
            gone = (
                now is None
                or now[0] != label
                or any(now[1][field] < value for field, value in counts.items())
            )  # expired while idle (perhaps used again since), or moved to another family
            if gone and label != name:  # a family keeps what its member counted
                retired = self._retired.setdefault(label, dict.fromkeys(COUNTERS, 0.0))
                for field, value in counts.items():
                    retired[field] += value
        self._members = seen
        for label, retired in self._retired.items():
            row = series.setdefault(label, _zeros())
            for field, value in retired.items():
                row[field] += value
        return series

    def read_data_loss(self) -> tuple[float, float, float]:
        """The `DATA_LOSS` gauges' values, from the epoch hash(es) of the namespace."""
        return self.store.last_data_loss(self.namespace)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (  # noqa: PLC0415 (the optional extra)
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        p, by = "celery_semaphore_", ["semaphore"]
        gauges = {name: GaugeMetricFamily(p + name, doc, labels=by) for name, doc in GAUGES}
        rate = GaugeMetricFamily(p + RATE[0], RATE[1], labels=by)
        counters = {
            field: CounterMetricFamily(p + name, doc, labels=by) for field, name, doc in COUNTED
        }
        attempts = CounterMetricFamily(
            p + "acquire_attempts", "Acquire attempts by outcome.", labels=[*by, "outcome"]
        )
        fair_grants = CounterMetricFamily(
            p + "fair_grants",
            "Permits granted to waiters of a fair key (fair_key=), by the key's fair weight "
            "(weight_class: 1, 2-3, 4-7, 8-15, 16+); no series per key.",
            labels=[*by, "weight_class"],
        )
        histograms = {
            "wait": HistogramMetricFamily(
                p + "wait_seconds", "Time from first ask to grant.", labels=by
            ),
            "hold": HistogramMetricFamily(p + "hold_seconds", "Time a permit was held.", labels=by),
        }
        for label, row in sorted(self.read().items()):
            for key, gauge in gauges.items():
                gauge.add_metric([label], row[key])
            if row["rated"]:
                rate.add_metric([label], row[RATE[0]])
            for field, counter in counters.items():
                counter.add_metric([label], row[field] / (1000 if field.endswith("_ms") else 1))
            for field, outcome in OUTCOMES.items():
                attempts.add_metric([label, outcome], row[field])
            if row["fair_keys_waiting"] or any(row[field] for field in FAIR_GRANTS):
                for field, weight_class in FAIR_GRANTS.items():
                    fair_grants.add_metric([label, weight_class], row[field])
            for kind, histogram in histograms.items():
                buckets, total = _histogram(row, kind)
                histogram.add_metric([label], buckets, total)
        yield from gauges.values()
        yield rate
        for (name, doc), value in zip(DATA_LOSS, self.read_data_loss(), strict=True):
            loss = GaugeMetricFamily(p + name, doc)
            loss.add_metric([], value)
            yield loss
        yield attempts
        yield fair_grants
        yield from counters.values()
        yield from histograms.values()


def _zeros() -> dict[str, float]:
    """A series' values before its first member; ``rated``: its members with a rate."""
    return dict.fromkeys((*(name for name, _ in GAUGES), RATE[0], "rated", *COUNTERS), 0.0)


def _histogram(row: dict[str, float], kind: str) -> tuple[list[tuple[str, float]], float]:
    cumulative = 0.0
    buckets = []
    for index, bound in enumerate((*BUCKETS, float("inf"))):
        cumulative += row[f"m_{kind}_b{index}"]
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return buckets, row[f"m_{kind}_sum"] / 1000


class MetricsServer:
    """The ``/metrics`` HTTP server thread; `close()` stops it, frees the port, and
    closes the store it read if it made it from a URL."""

    def __init__(self, server: Any, collector: SemaphoreCollector, owns_store: bool) -> None:
        self._server = server
        self._collector = collector
        self._owns_store = owns_store

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._owns_store:
            self._collector.store.close()


def serve(
    client: Any,
    namespace: str,
    port: int,
    url: str = "",
    addr: str = "0.0.0.0",
    *,
    per_key: bool = False,
) -> MetricsServer:
    """Serve ``/metrics`` on ``port`` from a thread (``per_key``: see `SemaphoreCollector`)."""
    from prometheus_client import (  # noqa: PLC0415 (the optional extra)
        CollectorRegistry,
        start_http_server,
    )

    registry = CollectorRegistry(auto_describe=False)
    collector = SemaphoreCollector(client, namespace, url, per_key)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, collector, owns_store=isinstance(client, str))
