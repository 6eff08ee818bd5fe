"""A real Flower process shows waiting tasks: state RETRY while they wait, and their retries.

Workers run with ``-E`` (task events). Flower takes ``retries`` from each
``task-received`` event, so a task that waited for a permit shows the waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery_harness import APPS, Cluster
from cluster_tools import Clusters

from celery_semaphore import Permit
from devkit.processes import wait_until
from devkit.redis_servers import free_port

pytestmark = pytest.mark.slow

COLUMNS = "name,uuid,state,args,kwargs,result,received,started,runtime,worker,retries"


class Flower:
    """``celery flower`` on a free port, reading the cluster's broker."""

    def __init__(self, cluster: Cluster, log: Path) -> None:
        self.port = free_port()
        self._log = log.open("wb")
        self.log = log
        command = [
            sys.executable, "-m", "celery", "-A", "limited_app", "flower",
            f"--port={self.port}", "--address=127.0.0.1", f"--tasks_columns={COLUMNS}",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            env={**cluster.env, "FLOWER_UNAUTHENTICATED_API": "1"},
            cwd=APPS,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode(errors="replace")

    def api(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)

    def task(self, task_id: str) -> dict[str, Any]:
        status, body = self.get(f"/api/task/info/{task_id}")
        return json.loads(body) if status == 200 else {}

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"flower exited:\n{self.log.read_text()[-3000:]}")
            try:
                return self.get("/healthcheck")[0] == 200
            except OSError:
                return False

        wait_until(up, 30, "flower answers")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


@pytest.fixture
def flower_of(tmp_path: Path) -> Iterator[Any]:
    made: list[Flower] = []

    def start(cluster: Cluster) -> Flower:
        made.append(Flower(cluster, tmp_path / f"flower{len(made)}.log"))
        made[-1].wait_ready()
        return made[-1]

    yield start
    for flower in made:
        flower.close()


@pytest.mark.parametrize("mode", ["countdown", "handover"])
def test_flower_shows_a_waiting_task_as_retry_with_its_waits(
    clusters: Clusters, flower_of: Any, mode: str
) -> None:
    """Countdown: each wait is a delivery, so the count grows while it waits.
    Handover: it parks (RETRY) and comes back once, when its turn comes."""
    conf = {"semaphore_backoff_max": 0.3, "semaphore_max_block": 0.0, "semaphore_wait_mode": mode}
    cluster = clusters(limit=1, extra_conf=conf)
    flower = flower_of(cluster)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=2, extra=["-E"])
    hold = cluster.app_module.hold
    warm = hold.delay(0.0, "warm")  # Flower has seen it: its event consumer is live
    assert warm.get(timeout=20) == "warm"
    cluster.wait_for(lambda: flower.task(warm.id).get("state") == "SUCCESS", 20, "flower live")
    assert flower.task(warm.id)["retries"] == 0

    blocker = cluster.semaphore("hold", 1).attempt(holder="test-blocker")
    assert isinstance(blocker, Permit)
    waiting = hold.delay(0.2, "waited")
    states: list[str] = []  # each attempt shows RECEIVED, STARTED (it asks), RETRY (it waits)

    waits = 3 if mode == "countdown" else 0

    def shown_waiting() -> bool:
        info = flower.task(waiting.id)
        states.append(info.get("state", "?"))
        return info.get("retries", 0) >= waits and states[-1] == "RETRY"

    cluster.wait_for(shown_waiting, 20, f"flower shows the task in RETRY after {waits} waits")
    assert not {"SUCCESS", "FAILURE"} & set(states)
    assert flower.task(waiting.id)["name"] == "limited_app.hold"
    listed = flower.api("/api/tasks")
    assert listed[waiting.id]["state"] in {"RECEIVED", "STARTED", "RETRY"}
    assert listed[waiting.id]["retries"] >= waits
    assert not cluster.started(waiting.id)
    shown = flower.task(waiting.id)["exception"]  # from the task-retried event
    assert shown.startswith("WaitingForPermit(") and "semaphore 'hold': place 1 in line" in shown
    if mode == "handover":
        time.sleep(1.0)
        assert flower.task(waiting.id)["state"] == "RETRY", "a parked task stays in RETRY"

    blocker.release()
    assert waiting.get(timeout=20) == "waited"
    cluster.wait_for(lambda: flower.task(waiting.id).get("state") == "SUCCESS", 20, "success")
    info = flower.task(waiting.id)
    seen = events.received_retries(waiting.id)
    assert info["retries"] == max(seen) == len(seen) - 1  # one per wait
    if mode == "handover":
        assert info["retries"] == 1
    assert info["result"] == "'waited'"
    assert flower.api("/api/tasks")[waiting.id]["retries"] == info["retries"]

    status, page = flower.get("/tasks")
    assert status == 200
    assert 'data-column="retries">Retries<' in page  # the column --tasks_columns asked for
    status, page = flower.get("/")
    assert status == 200
    assert "Flower" in page


def test_flower_names_the_rate_a_task_waits_for(clusters: Clusters, flower_of: Any) -> None:
    """A task the rate refuses (here 6 a minute, set at run time) waits as a retry
    like one refused a permit: RETRY in Flower, its reason naming the rate's slot.
    (Countdown mode: in handover mode such a task parks at publish and reaches no
    worker before its slot.)"""
    conf = {"semaphore_wait_mode": "countdown", "semaphore_max_block": 0.0}
    cluster = clusters(extra_conf=conf)
    flower = flower_of(cluster)
    cluster.worker("w1", concurrency=2, extra=["-E"])
    paced = cluster.app_module.paced
    warm = paced.delay(0.0, "warm")
    assert warm.get(timeout=20) == "warm"
    cluster.wait_for(lambda: flower.task(warm.id).get("state") == "SUCCESS", 20, "flower live")
    semaphore = cluster.semaphore("paced")
    semaphore.set_rate("6/m")
    try:
        results = [paced.delay(0.0, f"t{i}") for i in range(2)]

        def shown_waiting_for_the_rate() -> bool:
            return any(
                flower.task(r.id).get("state") == "RETRY"
                and "for its rate's slot" in flower.task(r.id).get("exception", "")
                for r in results
            )

        cluster.wait_for(shown_waiting_for_the_rate, 30, "flower shows a wait for the rate")
        waiting = [r for r in results if not cluster.started(r.id)]
        assert waiting, "a task waits for the rate's slot, not started"
        shown = flower.task(waiting[0].id)["exception"]
        assert shown.startswith("WaitingForPermit(") and "semaphore 'paced'" in shown
        assert [r.get(timeout=40) for r in results] == ["t0", "t1"]
    finally:
        semaphore.clear_rate()
