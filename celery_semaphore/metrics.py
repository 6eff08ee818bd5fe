"""Prometheus metrics, computed from Redis at scrape time: one cluster-wide view.

The scripts keep counters and histogram buckets in each semaphore's ``meta``
hash (``m_*`` fields), so any process can serve the same numbers, whichever
worker did the work. Serve them with ``celery worker --semaphore-metrics-port
9808`` (any one worker is enough; every worker that serves them shows the same
series), or from your own process with `serve()` or by registering
`SemaphoreCollector`. Needs the ``prometheus`` extra. Counters restart
from zero when a semaphore's keys expire while idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .core.discovery import open_semaphore, semaphore_names
from .core.errors import UnknownSemaphore
from .core.keys import semaphore_keys
from .core.protocol import text

#: Upper bounds (seconds) of the wait and hold histograms; the Lua scripts use the same.
BUCKETS = (0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0, 1800.0)
OUTCOMES = {"m_granted": "granted", "m_refused": "refused", "m_abandoned": "abandoned"}


class SemaphoreCollector:
    """A prometheus_client collector reading every semaphore of one namespace."""

    def __init__(self, client: Any, namespace: str, url: str = "") -> None:
        self.client = client
        self.namespace = namespace
        self.url = url

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (  # noqa: PLC0415 (the optional extra)
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        p = "celery_semaphore_"
        holders = GaugeMetricFamily(p + "holders", "Live permit holders.", labels=["semaphore"])
        limit = GaugeMetricFamily(p + "limit", "Effective limit.", labels=["semaphore"])
        waiters = GaugeMetricFamily(p + "waiters", "Live places in line.", labels=["semaphore"])
        draining = GaugeMetricFamily(p + "draining", "1 while draining.", labels=["semaphore"])
        parked = GaugeMetricFamily(
            p + "parked", "Waiting tasks parked in Redis until their turn.", labels=["semaphore"]
        )
        handed = GaugeMetricFamily(
            p + "handed_over",
            "Parked tasks published for their turn, not yet at a worker.",
            labels=["semaphore"],
        )
        parks = CounterMetricFamily(p + "parks", "Tasks parked.", labels=["semaphore"])
        handovers = CounterMetricFamily(
            p + "handovers", "Parked tasks handed over (published).", labels=["semaphore"]
        )
        handover_retries = CounterMetricFamily(
            p + "handover_retries",
            "Handed-over tasks published again after their deadline.",
            labels=["semaphore"],
        )
        attempts = CounterMetricFamily(
            p + "acquire_attempts", "Acquire attempts by outcome.", labels=["semaphore", "outcome"]
        )
        renewals = CounterMetricFamily(
            p + "lease_renewals", "Leases renewed.", labels=["semaphore"]
        )
        lost = CounterMetricFamily(
            p + "permits_lost",
            "Permits lost while their task ran (found gone by a worker's heartbeat).",
            labels=["semaphore"],
        )
        expired = CounterMetricFamily(
            p + "leases_expired",
            "Permits reclaimed after their lease ran out.",
            labels=["semaphore"],
        )
        waits = HistogramMetricFamily(
            p + "wait_seconds", "Time from first ask to grant.", labels=["semaphore"]
        )
        holds = HistogramMetricFamily(
            p + "hold_seconds", "Time a permit was held.", labels=["semaphore"]
        )
        for name in semaphore_names(self.client, self.namespace, self.url):
            try:
                status = open_semaphore(self.client, self.namespace, name, self.url).status()
            except UnknownSemaphore:
                continue  # its keys went, or no contender has declared a limit yet
            raw = self.client.hgetall(semaphore_keys(self.namespace, name).meta)
            meta = {text(k): text(v) for k, v in raw.items()}
            holders.add_metric([name], status.holder_count)
            limit.add_metric([name], status.effective_limit)
            waiters.add_metric([name], status.waiter_count)
            draining.add_metric([name], 1 if status.draining else 0)
            parked.add_metric([name], status.parked_count)
            handed.add_metric([name], status.handed_over_count)
            parks.add_metric([name], float(meta.get("m_parked", 0)))
            handovers.add_metric([name], float(meta.get("m_handed_over", 0)))
            handover_retries.add_metric([name], float(meta.get("m_handover_retried", 0)))
            for field, outcome in OUTCOMES.items():
                attempts.add_metric([name, outcome], float(meta.get(field, 0)))
            renewals.add_metric([name], float(meta.get("m_renewed", 0)))
            lost.add_metric([name], float(meta.get("m_lost", 0)))
            expired.add_metric([name], float(meta.get("m_expired", 0)))
            for family, kind in ((waits, "wait"), (holds, "hold")):
                buckets, total = _histogram(meta, kind)
                family.add_metric([name], buckets, total)
        yield from (
            holders,
            limit,
            waiters,
            draining,
            parked,
            handed,
            attempts,
            parks,
            handovers,
            handover_retries,
            renewals,
            lost,
            expired,
            waits,
            holds,
        )


def _histogram(meta: dict[str, str], kind: str) -> tuple[list[tuple[str, float]], float]:
    cumulative = 0.0
    buckets = []
    for index, bound in enumerate((*BUCKETS, float("inf"))):
        cumulative += float(meta.get(f"m_{kind}_b{index}", 0))
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return buckets, float(meta.get(f"m_{kind}_sum", 0)) / 1000


class MetricsServer:
    """The ``/metrics`` HTTP server thread; `close()` stops it and frees the port."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(
    client: Any, namespace: str, port: int, url: str = "", addr: str = "0.0.0.0"
) -> MetricsServer:
    """Serve ``/metrics`` on ``port`` from a thread."""
    from prometheus_client import (  # noqa: PLC0415 (the optional extra)
        CollectorRegistry,
        start_http_server,
    )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SemaphoreCollector(client, namespace, url))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server)
