"""The semaphores' Redis losing its data loses no task whose broker survives, and
admits no one over the limit.

The issue's scenario at CI size: a backlog of tasks under limits 1 and 3 waits
while the semaphores' Redis, a server of its own without persistence, is
restarted empty five times; tasks are published before and between the
restarts. Every submitted task must run (at least once: duplicates are counted
and shown), never more bodies at once than the limit, and admissions resume
after each restart (the delay until the first body starts is printed: the
target is the renewal interval + 1 s). On both brokers waiting tasks park in
the broker (parking queues; celery_semaphore/durability.py), so nothing is
lost and no process warns. Before tasks parked only where their message is at
least as safe as in the broker, the tasks parked there went with its data: 29
of 108 acks_late tasks never ran on the Redis broker, 32 of 108 on RabbitMQ, 29
of 108 early-ack ones; before the pause after a loss
(celery_semaphore/core/redis/epochs.py), 2 bodies ran at once under limit 1 and
5 under limit 3.

And parking in the semaphores' Redis still happens where it is safe: the Redis
broker's own server, and on another broker (kombu's filesystem transport here,
as SQS would be) a Redis that appends every write (its parked tasks outlive its
restart); on another broker with a Redis that persists nothing, tasks wait as
countdown retries and the process says so once, whether or not the retired
opt-in (semaphore_park_without_persistence) is set.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery_harness import Cluster, max_overlap
from cluster_tools import Clusters, eta_countdowns
from test_brokers_canvas import AMQP
from test_handover import NOT_PARKED_WARNING, PARKING, block, starts, states, wait_parked

from celery_semaphore import Permit, Semaphore
from devkit.redis_servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

RESTARTS = 5
BETWEEN_RESTARTS = 2.5
# Tasks for limits 1 and 3 published first, then after each restart: 120 in all,
# about 12 s of work at the limits, so a backlog waits at every restart.
FIRST_WAVE, LATER_WAVES = (20, 40), (4, 8)
ONE_SECONDS, THREE_SECONDS = 0.3, 0.5
ALL_RUN_WITHIN = 40.0  # after the last publish; the work is ~10 s at the limits
# Waits that cannot estimate a turn (after each loss) back off at most 2 s.
SETTINGS = {"semaphore_backoff_max": 2.0, "semaphore_heartbeat_interval": 0.5}
LIMITS = {"one": 1, "three": 3}
LOSS_REPORTED = "lost its data: the tasks parked there are lost"
LOSS_NOTICED = "lost its data; no permit is granted until"
PLACES_REBUILT = "parked in the broker their places in line again"


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


@dataclass
class Outcome:
    submitted: list[str]
    runs: Counter[str]
    peaks: dict[str, int]
    logs: list[str]
    restarts: list[float]  # when each restart of the semaphores' Redis was done
    starts: list[float]  # when each body started

    @property
    def resumed_after(self) -> list[float | None]:
        """For each restart: seconds until the first body started after it (None:
        none before the next restart, or the end)."""
        ends = [*self.restarts[1:], float("inf")]
        return [
            min((t - restart for t in self.starts if restart < t < end), default=None)
            for restart, end in zip(self.restarts, ends, strict=True)
        ]

    @property
    def never_ran(self) -> list[str]:
        return [tag for tag in self.submitted if not self.runs[tag]]

    @property
    def duplicates(self) -> dict[str, int]:
        return {tag: runs for tag, runs in self.runs.items() if runs > 1}

    def check_every_task_ran(self) -> None:
        resumed = [None if d is None else round(d, 2) for d in self.resumed_after]
        print(
            f"peak bodies at once (limits 1 and 3): {self.peaks}; "
            f"ran more than once: {self.duplicates or 'none'}; first start after each "
            f"restart (s): {resumed}"
        )
        assert not self.never_ran, (
            f"{len(self.never_ran)} of {len(self.submitted)} submitted tasks never ran "
            f"({RESTARTS} restarts of the semaphores' Redis), e.g. {self.never_ran[:5]}; "
            f"{len(self.duplicates)} ran more than once: {self.duplicates}"
        )
        over = {name: peak for name, peak in self.peaks.items() if peak > LIMITS[name]}
        assert not over, f"more bodies at once than the limits {LIMITS}: {over}"
        assert None not in self.resumed_after, f"admissions stopped: {self.resumed_after}"
        assert all(LOSS_NOTICED in log for log in self.logs), "each worker reports the losses"

    def check_parked_in_the_broker(self, *, parked: bool = True) -> None:
        """No task parked in the semaphores' Redis: no process warned that they may
        not park, none reported parked tasks lost; ``parked``: tasks parked in the
        broker's parking queues, and a worker gave them their places again."""
        assert not any(NOT_PARKED_WARNING in log for log in self.logs), "they may park"
        assert not any(LOSS_REPORTED in log for log in self.logs), "none parked in Redis"
        rebuilt = any(PLACES_REBUILT in log for log in self.logs)
        assert rebuilt is parked, "places given again to the tasks parked in the broker"


def backlog_through_restarts(
    clusters: Clusters,
    *,
    late: bool,
    wait_mode: str = "handover",
    broker_url: str | None = None,
    queue: str | None = None,
) -> Outcome:
    """Publish a wave of tasks, restart the semaphores' Redis empty, RESTARTS times,
    then a last wave; wait until every task ran or ALL_RUN_WITHIN passed."""
    suffix = uuid.uuid4().hex[:8]
    with RedisServer() as semaphores:
        conf = {**SETTINGS, "semaphore_redis_url": semaphores.url, "semaphore_wait_mode": wait_mode}
        cluster = clusters(limit=1, broker_url=broker_url, extra_conf=conf)
        workers = [
            cluster.worker(f"{name}-{suffix}", concurrency=3, queues=queue) for name in ("w1", "w2")
        ]
        tasks = cluster.app_module
        one, three = (tasks.hold_late, tasks.wide_late) if late else (tasks.hold, tasks.wide)
        submitted: list[str] = []
        restarts: list[float] = []
        for wave in range(RESTARTS + 1):
            ones, threes = LATER_WAVES if wave else FIRST_WAVE
            for i in range(threes):
                if i < ones:
                    submitted.append(f"one-{wave}-{i}")
                    one.apply_async((ONE_SECONDS, submitted[-1]), queue=queue)
                submitted.append(f"three-{wave}-{i}")
                three.apply_async((THREE_SECONDS, submitted[-1]), queue=queue)
            if wave < RESTARTS:
                time.sleep(BETWEEN_RESTARTS)
                semaphores.restart()
                restarts.append(time.time())
        deadline = time.monotonic() + ALL_RUN_WITHIN
        while time.monotonic() < deadline and not set(submitted) <= started_tags(cluster):
            time.sleep(0.5)
        time.sleep(1.0)  # a duplicate still under way shows up
        events = cluster.events()
        return Outcome(
            submitted=submitted,
            runs=Counter(e["tag"] for e in events if e["event"] == "start"),
            peaks={
                name: max_overlap([e for e in events if e["task"] == task.name])
                for name, task in (("one", one), ("three", three))
            },
            logs=[worker.text() for worker in workers],
            restarts=restarts,
            starts=[e["at"] for e in events if e["event"] == "start"],
        )


def started_tags(cluster: Cluster) -> set[str]:
    return {e["tag"] for e in cluster.events() if e["event"] == "start"}


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_backlog_of_acks_late_tasks_survives_restarts_of_a_semaphore_redis_without_persistence(
    clusters: Clusters, request: pytest.FixtureRequest, broker: str
) -> None:
    """The semaphores' Redis is not the broker's server: waiting tasks park in the
    broker's parking queues, and a worker gives them their places again after each
    restart."""
    on_rabbitmq: dict[str, Any] = {}
    if broker == "rabbitmq":
        vhost = request.getfixturevalue("rabbitmq_vhost")
        on_rabbitmq = {"broker_url": f"{AMQP}/{vhost}", "queue": f"cs-loss-{uuid.uuid4().hex[:8]}"}
    outcome = backlog_through_restarts(clusters, late=True, **on_rabbitmq)
    outcome.check_every_task_ran()
    outcome.check_parked_in_the_broker()


@pytest.mark.parametrize("wait_mode", ["handover", "countdown"])
def test_early_ack_tasks_survive_them_too(clusters: Clusters, wait_mode: str) -> None:
    outcome = backlog_through_restarts(clusters, late=False, wait_mode=wait_mode)
    outcome.check_every_task_ran()
    outcome.check_parked_in_the_broker(parked=wait_mode == "handover")


def durability_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_semaphore.durability"]


@pytest.fixture
def other_broker(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A broker of kombu's other transports (as SQS would be), neither AMQP nor Redis:
    its parked tasks may wait only in a semaphores' Redis that appends every write.
    The URL and the settings it needs (its folders, shared by the workers and this
    process)."""
    folders = {name: tmp_path / name for name in ("messages", "control")}
    for folder in folders.values():
        folder.mkdir()
    options = {
        "data_folder_in": str(folders["messages"]),
        "data_folder_out": str(folders["messages"]),
        "control_folder": str(folders["control"]),
        "polling_interval": 0.05,
    }
    return "filesystem://", {"broker_transport_options": options}


RETIRED_WARNING = "the setting semaphore_park_without_persistence is retired and ignored"


@pytest.mark.parametrize("retired_opt_in", [False, True], ids=["", "retired opt-in set"])
def test_on_another_broker_a_redis_without_persistence_gets_countdown_waits_and_one_warning(
    clusters: Clusters,
    caplog: pytest.LogCaptureFixture,
    other_broker: tuple[str, dict[str, Any]],
    retired_opt_in: bool,
) -> None:
    """Set or not, semaphore_park_without_persistence changes nothing: the tasks wait
    as countdown retries, their messages in the broker, and each process says why
    once (and, where it is set, that it is retired: once, not once per pool process)."""
    broker_url, broker_conf = other_broker
    with RedisServer() as semaphores:
        conf = {**PARKING, **broker_conf, "semaphore_redis_url": semaphores.url}
        if retired_opt_in:
            conf["semaphore_park_without_persistence"] = True
        cluster = clusters(limit=1, broker_url=broker_url, extra_conf=conf)
        events = clusters.events(cluster)
        worker = cluster.worker("w1", concurrency=3, extra=["-E"])
        sem = Semaphore(semaphores.url, "hold", 1)
        blocker = sem.attempt("test-blocker")
        assert isinstance(blocker, Permit)
        results = [cluster.app_module.hold.delay(0.1, i) for i in range(5)]
        cluster.wait_for(
            lambda: all(eta_countdowns(events, r.id) for r in results), 20, "countdown retries"
        )
        assert sem.status().parked_count == 0
        assert not set(states(sem).values()) & {"parked", "handed"}
        blocker.release()
        assert sorted(r.get(timeout=30) for r in results) == list(range(5))
        sem.close()
    (warning,) = [line for line in worker.text().splitlines() if NOT_PARKED_WARNING in line]
    assert f"the Redis at {semaphores.url}: it is not the broker's server" in warning
    assert "appendonly no" in warning
    assert "countdown retries instead" in warning
    assert "Set appendonly yes on that Redis to let tasks park there" in warning
    assert worker.text().count(RETIRED_WARNING) == (1 if retired_opt_in else 0)
    assert len(durability_warnings(caplog)) == 1  # the publisher's (this process)


def test_tasks_still_park_in_the_brokers_own_server_and_nobody_warns(
    clusters: Clusters, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = clusters(limit=1, extra_conf=PARKING)  # semaphores: db 1 of the broker's server
    worker = cluster.worker("w1", concurrency=3)
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    results = [cluster.app_module.hold.delay(0.1, i) for i in range(5)]
    wait_parked(cluster, sem, [r.id for r in results])
    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(5))
    assert NOT_PARKED_WARNING not in worker.text()
    assert durability_warnings(caplog) == []


def test_on_another_broker_tasks_park_in_a_redis_that_appends_every_write_and_outlive_its_restart(
    clusters: Clusters, caplog: pytest.LogCaptureFixture, other_broker: tuple[str, dict[str, Any]]
) -> None:
    broker_url, broker_conf = other_broker
    with RedisServer("--appendonly", "yes") as semaphores:
        conf = {**PARKING, **broker_conf, "semaphore_redis_url": semaphores.url}
        cluster = clusters(limit=1, broker_url=broker_url, extra_conf=conf)
        worker = cluster.worker("w1", concurrency=3)
        sem = Semaphore(semaphores.url, "hold", 1)
        blocker = sem.attempt("test-blocker")
        assert isinstance(blocker, Permit)
        results = [cluster.app_module.hold.delay(0.1, i) for i in range(5)]
        wait_parked(cluster, sem, [r.id for r in results])
        assert sem.status().parked_count == 5  # their messages are in this Redis

        semaphores.restart()  # the AOF brings everything back
        time.sleep(1.0)
        assert states(sem) == {r.id: "parked" for r in results}
        assert blocker.release()
        assert [r.get(timeout=30) for r in results] == list(range(5))
        assert starts(cluster) == list(range(5))
        sem.close()
    assert NOT_PARKED_WARNING not in worker.text()
    assert "lost its data" not in worker.text()
    assert durability_warnings(caplog) == []


def bodies_at_once(events: list[dict[str, Any]], task: str, ended: dict[int, float]) -> int:
    """Most bodies of ``task`` at once; ``ended``: pid -> when that process was killed
    (its body ended then, with no record of its own)."""
    records = [e for e in events if e["task"] == task]
    finished = {(e["id"], e["pid"]) for e in records if e["event"] == "end"}
    for e in list(records):
        if e["event"] == "start" and (e["id"], e["pid"]) not in finished and e["pid"] in ended:
            records.append({**e, "event": "end", "at": ended[e["pid"]]})
    return max_overlap(records)


def test_a_worker_killed_during_the_pause_loses_no_task_and_breaks_no_cap(
    clusters: Clusters,
) -> None:
    """Two workers each run a long acks_late task under limit 2, a backlog waits; the
    semaphores' Redis restarts empty and one worker is SIGKILLed 0.3 s later, within
    the pause (it may or may not have written its permit back: either way its
    lease is the backstop). Its task comes back from the broker."""
    with RedisServer() as semaphores:
        conf = {
            **SETTINGS,
            "semaphore_redis_url": semaphores.url,
            "broker_transport_options": {"visibility_timeout": 10},
        }
        cluster = clusters(limit=2, lease=3.0, extra_conf=conf)
        doomed, survivor = (
            cluster.worker(name, concurrency=1, extra=["--prefetch-multiplier", "1"])
            for name in ("doomed", "survivor")
        )
        tasks = cluster.app_module
        submitted = ["long-0", "long-1", *(f"short-{i}" for i in range(6))]
        for tag in submitted:
            tasks.hold_late.apply_async((2.5 if tag.startswith("long") else 0.3, tag))
            if tag.startswith("long"):  # one on each worker
                cluster.wait_for(lambda t=tag: t in started_tags(cluster), 20, f"{tag} running")
        children = doomed.children()
        semaphores.restart()
        restarted = time.time()
        time.sleep(0.3)
        doomed.kill_all()
        killed = dict.fromkeys(children, time.time())
        cluster.wait_for(lambda: set(submitted) <= started_tags(cluster), 40, "every task ran")
        time.sleep(3.0)  # the last ones end
        events = cluster.events()
    peak = bodies_at_once(events, tasks.hold_late.name, killed)
    starts = sorted(e["at"] for e in events if e["event"] == "start" and e["at"] > restarted)
    print(f"peak bodies at once (limit 2): {peak}; first start after the restart: "
          f"{starts[0] - restarted:.2f} s")  # fmt: skip
    assert peak <= 2, events
    assert LOSS_NOTICED in survivor.text()
    assert "wrote back the permits of 1 running limited task(s)" in survivor.text()


def test_a_limit_lowered_during_the_pause_lets_the_restored_holders_run_and_the_line_wait(
    clusters: Clusters,
) -> None:
    """Three long tasks run under limit 3 with a backlog behind them; the semaphores'
    Redis restarts empty and the limit is lowered to 1 at once (an operator's
    override). The three written back keep running; nobody else starts until all
    three ended, then one at a time."""
    with RedisServer() as semaphores:
        conf = {**SETTINGS, "semaphore_redis_url": semaphores.url}
        cluster = clusters(limit=1, extra_conf=conf)
        workers = [cluster.worker(name, concurrency=3) for name in ("w1", "w2")]
        tasks = cluster.app_module
        for i in range(3):
            tasks.wide.apply_async((2.5, f"long-{i}"))
        cluster.wait_for(lambda: len(started_tags(cluster)) == 3, 20, "the long tasks running")
        for i in range(4):
            tasks.wide.apply_async((0.3, f"short-{i}"))
        time.sleep(0.3)  # the short ones are refused, in line
        semaphores.restart()
        # the app's pause after a loss (as `celery semaphore set-limit` would use)
        operator = Semaphore(semaphores.url, "wide", 3, pause_after_loss=1.0)
        operator.set_limit(1)
        cluster.wait_for(lambda: len(started_tags(cluster)) == 7, 30, "every task ran")
        time.sleep(0.6)
        events = [e for e in cluster.events() if e["task"] == tasks.wide.name]
        assert operator.status().effective_limit == 1
        operator.close()
    last_long_end = max(e["at"] for e in events if e["event"] == "end" and "long" in e["tag"])
    shorts = [e for e in events if "short" in e["tag"]]
    first_short = min(e["at"] for e in shorts if e["event"] == "start")
    print(f"first short start {first_short - last_long_end:+.2f} s after the last long end")
    assert first_short >= last_long_end, "a task started while the restored holders filled the cap"
    assert max_overlap(shorts) == 1, shorts
    assert sum(LOSS_NOTICED in w.text() for w in workers) >= 1
