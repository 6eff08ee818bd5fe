"""counts.lua, what a metrics scrape reads of each semaphore (`read_counts()`), on a
real Redis: the same figures as `status()` for the same state, and Redis work that does
not grow with the line (no entry read one by one, no scan)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from outcomes import granted, refused

from celery_semaphore import Handover, Semaphore
from celery_semaphore.core.operations import open_semaphore
from celery_semaphore.core.redis.discovery import read_counts
from celery_semaphore.core.results import SemaphoreCounts
from devkit.redis_servers import RedisClusterServers, RedisServer

NAMESPACE = "celery_semaphore"
SHORT = 0.2  # leases and places that run out before the reading
#: The figures both readings have, compared one to one.
FIGURES = (
    "declared_limit", "effective_limit", "draining", "holder_count", "waiter_count",
    "parked_count", "handed_over_count", "sent_count", "rate", "rate_paused_until",
    "fair_keys_waiting",
)  # fmt: skip


@pytest.fixture
def made() -> Iterator[list[Semaphore]]:
    semaphores: list[Semaphore] = []
    yield semaphores
    for sem in semaphores:
        sem.close()


def build(client: Any, made: list[Semaphore], tag: str) -> list[str]:
    """Semaphores in every state a count tells, on ``client``; their names. Places and
    leases of SHORT seconds run out (not reclaimed: nothing is called after them)."""
    handed: list[Handover] = []

    def sem(name: str, limit: int, **kwargs: Any) -> Semaphore:
        made.append(Semaphore(client, f"{tag}-{name}", limit, **kwargs))
        return made[-1]

    weights = sem("weights", 4, family="fam")
    granted(weights.attempt("heavy", weight=3))
    granted(weights.attempt("light"))
    refused(weights.attempt("w1", wait_lease=60))
    refused(weights.attempt("w2", weight=2, wait_lease=60))
    refused(weights.attempt("gone", wait_lease=SHORT))
    weights.set_limit(5)  # an override: the effective limit is 5, the recorded 4

    lapsed = sem("lapsed", 2)
    granted(lapsed.attempt("run-out", lease_timeout=SHORT))
    granted(lapsed.attempt("live"))

    parking = sem("parking", 1, on_handover=handed.extend)
    first = granted(parking.attempt("holder"))
    for holder in ("p1", "p2", "p3", "p4"):
        parking.park(holder, "payload", refused(parking.attempt(holder)).ticket)
    first.release()  # the first one or two are handed over (a window's worth), the rest stay
    assert 1 <= len(handed) < 4

    sent = sem("sent", 1)
    granted(sent.attempt("holder"))
    for i in range(3):
        sent.take_place(f"queued-{i}", wait_lease=60)
    for i in range(2):
        sent.take_place(f"lapsing-{i}", wait_lease=SHORT)

    fair = sem("fair", 1)
    granted(fair.attempt("holder"))
    for key, count in (("a", 3), ("b", 1), ("c", 2)):
        for i in range(count):
            refused(fair.attempt(f"{key}-{i}", fair_key=key, wait_lease=60))

    rated = sem("rated", 3, rate="10/s")
    granted(rated.attempt("one"))
    rated.pause_rate(30)
    rated.set_draining(True)

    time.sleep(SHORT + 0.1)
    return [s.name for s in made]


def compare(client: Any, names: list[str]) -> list[SemaphoreCounts]:
    counts = read_counts(client, NAMESPACE, [*names, "never-declared"], ["family", "m_granted"])
    assert [c.name for c in counts] == names  # one without a recorded limit is left out
    for count in counts:
        status = open_semaphore(client, NAMESPACE, count.name).status()
        assert {f: getattr(count, f) for f in FIGURES} == {f: getattr(status, f) for f in FIGURES}
        assert abs(count.server_time - status.server_time) < 1
    return counts


def test_counts_equal_what_status_reports(
    redis_session_server: RedisServer, made: list[Semaphore]
) -> None:
    names = build(redis_session_server.url, made, f"counts-{uuid.uuid4().hex}")
    with redis.Redis.from_url(redis_session_server.url) as client:
        counts = {c.name.rsplit("-", 1)[1]: c for c in compare(client, names)}
        # the sent tasks whose place lapsed: status tells them (a lookup each), counts not
        assert open_semaphore(client, NAMESPACE, names[3]).status().sent_without_place_count == 2
    # each figure is seen at a value that tells something, so the comparison can fail
    weights, parking, sent = counts["weights"], counts["parking"], counts["sent"]
    rated = counts["rated"]
    assert (weights.holder_count, weights.waiter_count) == (4, 2)
    assert (weights.declared_limit, weights.effective_limit) == (4, 5)
    assert counts["lapsed"].holder_count == 1
    assert parking.parked_count > 0 and parking.handed_over_count > 0
    assert parking.parked_count + parking.handed_over_count == 4
    assert (sent.sent_count, sent.waiter_count) == (5, 3)
    assert counts["fair"].fair_keys_waiting == 3
    assert str(rated.rate) == "10/s" and rated.draining
    assert rated.rate_paused_until is not None
    assert rated.rate_paused_until - rated.server_time == pytest.approx(30, abs=1)
    assert weights.fields == {"family": "fam", "m_granted": "2"}
    assert parking.fields == {"family": "", "m_granted": "1"}


def test_counts_on_a_redis_cluster_equal_what_status_reports(
    redis_cluster: RedisClusterServers, made: list[Semaphore]
) -> None:
    with redis_cluster.client() as client:
        names = build(client, made, "cluster")
        compare(client, names)
        assert len({client.get_node_from_key(sem.keys.meta).name for sem in made}) > 1


class Monitor(threading.Thread):
    """The commands the scripts run (MONITOR: client type 'lua'), each as a list of words."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.commands: list[list[str]] = []
        self.ready = threading.Event()

    def run(self) -> None:
        with self.client.monitor() as monitor:
            self.ready.set()
            while True:
                try:
                    seen = monitor.next_command()
                except redis.ConnectionError:  # the test failed first, its server stopped
                    return
                if seen["command"] == "ECHO end-of-test":
                    return
                if seen["client_type"] == "lua":
                    self.commands.append(seen["command"].split())


def test_a_count_runs_the_same_few_commands_for_a_long_line_as_for_none(
    redis_server: RedisServer, made: list[Semaphore]
) -> None:
    long = Semaphore(redis_server.url, "long", 10)
    empty = Semaphore(redis_server.url, "empty", 1)
    made += [long, empty]
    for i in range(10):
        granted(long.attempt(f"h{i}"))
    for i in range(300):
        refused(long.attempt(f"w{i}", fair_key=f"k{i % 50}", wait_lease=60))
    for i in range(100):
        long.take_place(f"s{i}", wait_lease=60 if i % 2 else SHORT)
    granted(empty.attempt("only"))
    empty.release("only")
    time.sleep(SHORT + 0.1)
    monitor = Monitor(redis_server.url)
    monitor.start()
    assert monitor.ready.wait(5)
    time.sleep(0.1)
    with redis.Redis.from_url(redis_server.url) as client:
        for name in ("long", "empty"):
            (count,) = read_counts(client, NAMESPACE, [name])
            assert count.waiter_count == (350 if name == "long" else 0)
            client.echo(f"end-of-{name}")
        client.echo("end-of-test")
    monitor.join(5)
    assert not monitor.is_alive()
    words = [c[0].strip('"').upper() for c in monitor.commands]
    # clock, epoch, meta, the live holders (kept permits among them), holders, line, sent
    one = ["TIME", "HMGET", "HMGET", "ZRANGEBYSCORE", "ZCOUNT", "ZCOUNT", "ZCOUNT"]
    assert words == one + one
    meta_reads = [c for c in monitor.commands if c[0].strip('"').upper() == "HMGET"][1::2]
    assert [c[1].strip('"') for c in meta_reads] == [long.keys.meta, empty.keys.meta]
