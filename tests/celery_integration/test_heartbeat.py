"""The worker's lease heartbeat, seen from outside real ``celery worker`` processes.

Leases here are short (2 s) and tasks long (5 s): a permit survives only if the
worker's main process keeps renewing it. Helpers and the app come from
test_endings.py and tests/celery_apps/endings_app.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery_harness import Cluster, max_overlap
from test_endings import (
    APP,
    WITHIN,
    endings,
    holder_ids,
    released_by,
    signals_of,
    start_of,
    starts_of,
    value,
    wait_signals,
)

from celery_semaphore.core.redis.scripts import FUNCTIONS, source

pytestmark = pytest.mark.slow
FIXTURES = (endings,)  # the cluster fixture of test_endings, shared here

LEASE = 2.0
BEAT = 0.5
FAST = {"semaphore_heartbeat_interval": BEAT, "semaphore_backoff_max": 0.5}
RENEW_SHA = hashlib.sha1(source("renew").encode()).hexdigest()
RENEW_FCALL = f'"FCALL" "{FUNCTIONS["renew"]}"'


def monitor(cluster: Cluster, seconds: float) -> list[str]:
    """Every command the test's redis-server runs for ``seconds`` (MONITOR lines)."""
    url = urlsplit(cluster.state_url)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(b"MONITOR\r\n")
        data = b""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
    lines = data.decode(errors="replace").split("\r\n")
    assert lines[0] == "+OK", lines[:3]
    return lines[1:]


def end_of(cluster: Cluster, task_id: str) -> dict[str, Any] | None:
    ends = [e for e in cluster.events() if e["id"] == task_id and e["event"] == "end"]
    return ends[0] if ends else None


POOLS = {
    # pool: (workers, concurrency); solo runs one task at a time, so the
    # contender needs a worker of its own to show it is the semaphore that stops it
    "prefork": (1, 2),
    "threads": (1, 2),
    "solo": (2, 1),
    "gevent": (1, 2),
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_long_task_keeps_its_permit_and_excludes_others(endings, pool):
    if pool == "gevent" and importlib.util.find_spec("gevent") is None:
        pytest.skip("gevent is not installed (pip install gevent, in the dev extra)")
    cluster, apps = endings(limit=1, lease=LEASE, extra_conf=FAST)
    workers, concurrency = POOLS[pool]
    for i in range(workers):
        cluster.worker(f"w{i + 1}", app=APP, pool=pool, concurrency=concurrency)
    long = apps.hold.delay(5.0, "long")
    started = start_of(cluster, long.id)
    contender = apps.hold.delay(0.2, "contender")
    samples = []
    while end_of(cluster, long.id) is None:
        status = cluster.semaphore().status()
        samples.append((time.time(), status))
        assert time.time() - started["at"] < 15, "the long task never ended"
        time.sleep(0.2)
    ended = end_of(cluster, long.id)
    assert ended is not None
    during = [s for at, s in samples if at < ended["at"] - 0.05]
    assert len(during) >= 15
    for status in during:  # held the whole time, by it alone; the contender never got in
        assert [h.holder for h in status.holders] == [long.id], status
        assert 0 < status.holders[0].expires_at - status.server_time <= LEASE + 0.05
    expiries = [s.holders[0].expires_at for s in during]
    assert len(set(expiries)) >= 5  # renewed about every 0.5 s over 5 s
    assert expiries == sorted(expiries)
    assert expiries[-1] - expiries[0] >= 3.0
    assert value(cluster, contender) == "contender"
    assert starts_of(cluster, contender.id)[0]["at"] >= ended["at"]
    assert max_overlap(cluster.events()) == 1
    released_by(cluster, time.time() + WITHIN, f"{pool} after both tasks")


def test_one_renew_call_per_interval_for_all_running_tasks(endings):
    cluster, apps = endings(limit=3, lease=LEASE, extra_conf=FAST)
    cluster.worker("w1", app=APP, concurrency=3)
    results = [apps.hold.delay(5.0, i) for i in range(3)]
    for r in results:
        start_of(cluster, r.id)
    assert cluster.holders() == 3
    window = 3.0
    lines = monitor(cluster, window)
    renews = [line for line in lines if f'"EVALSHA" "{RENEW_SHA}"' in line or RENEW_FCALL in line]
    # one renew_many per interval for the three tasks: ~6 in 3 s, not ~18
    assert window / BEAT - 2 <= len(renews) <= window / BEAT + 2, renews
    for line in renews:
        assert all(f'"{r.id}"' in line for r in results), line
    assert [value(cluster, r) for r in results] == [0, 1, 2]
    released_by(cluster, time.time() + WITHIN, "after the three tasks")


def test_lost_permit_is_reported_and_not_resurrected(endings):
    cluster, apps = endings(limit=1, lease=LEASE, extra_conf={**FAST, "semaphore_max_block": 0.2})
    worker = cluster.worker("w1", app=APP, concurrency=2)
    long = apps.hold.delay(6.0, "long")
    started = start_of(cluster, long.id)
    time.sleep(BEAT * 1.5)
    assert holder_ids(cluster) == [long.id]
    cluster.redis.delete(*cluster.semaphore().keys.script_keys)  # Redis lost the data
    # reported by the main process once a beat that saw it held is followed by misses
    # at least max_block + 1 s apart: ~1.2-1.7 s after the loss
    cluster.wait_for(
        lambda: signals_of(cluster, "permit_lost", long.id), 2.2 + 3 * BEAT + 1.0, "permit_lost"
    )
    lost = signals_of(cluster, "permit_lost", long.id)
    assert lost[0]["pid"] == worker.pid
    assert lost[0]["semaphore"] == "hold"
    assert lost[0]["task_name"] == "limited_app.hold"
    assert lost[0]["at"] - started["at"] < 2.2 + 3 * BEAT + 0.5
    assert any(
        "ERROR/MainProcess" in line and f"[{long.id}] on semaphore hold is lost" in line
        for line in worker.text().splitlines()
    )
    # the renewals never bring it back: it does not count against the limit any more
    assert holder_ids(cluster) == []
    other = apps.hold.delay(0.2, "other")
    assert value(cluster, other) == "other"
    assert end_of(cluster, long.id) is None, "the long task should still be running"
    assert value(cluster, long) == "long"
    assert len(signals_of(cluster, "permit_lost", long.id)) == 1  # reported once, not per beat
    released = wait_signals(cluster, "permit_released", long.id)
    assert [e["released"] for e in released] == [False]  # the child found it gone
    assert "was lost before the task ended" in worker.text()
    released_by(cluster, time.time() + WITHIN, "after the lost permit")
