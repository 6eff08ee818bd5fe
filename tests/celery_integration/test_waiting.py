"""Waiting for a permit in real ``celery worker`` processes, mostly in countdown mode.

Waits are retries: they show in ``request.retries`` to the outside (events,
Flower) but not against the task's own ``max_retries``; the wait budget fails
the task with SemaphoreTimeout and gives up its place (in both modes); the
backoff stays capped; tasks start in submission order; per-key caps are
independent; and each ``semaphore_on_redis_error`` policy does what it says.
Handover mode (parking) has its own tests in test_handover.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters, eta_countdowns, intervals

from celery_semaphore import Permit, SemaphoreConnectionError, SemaphoreTimeout, publish
from devkit.measures import kendall_tau
from devkit.redis_servers import RedisServer

pytestmark = pytest.mark.slow

# Countdown mode, short backoff, no waiting in place: every refused attempt is a retry
# through the broker.
FAST = {
    "semaphore_wait_mode": "countdown",
    "semaphore_backoff_base": 0.05,
    "semaphore_backoff_max": 0.2,
    "semaphore_max_block": 0.0,
}
# Handover mode, no waiting in place: a refused task parks; the heartbeat looks
# after parked tasks every 0.3 s.
PARKING = {"semaphore_max_block": 0.0, "semaphore_heartbeat_interval": 0.3}


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def block(cluster: Any, name: str = "hold", limit: int = 1) -> Permit:
    """Take every permit of ``name`` from the test process (limit 1), as a long holder would."""
    permit = cluster.semaphore(name, limit).attempt(holder=f"test-blocker-{name}")
    assert isinstance(permit, Permit)
    return permit


def starts_in_order(cluster: Any) -> list[Any]:
    """Tags of every body start, in time order."""
    records = sorted(cluster.events(), key=lambda e: e["at"])
    return [e["tag"] for e in records if e["event"] == "start"]


def starts(cluster: Any, task_id: str) -> list[Any]:
    """Tags of the body's start records of one task, in time order."""
    records = sorted(cluster.events(), key=lambda e: e["at"])
    return [e["tag"] for e in records if e["id"] == task_id and e["event"] == "start"]


def test_waits_do_not_use_up_the_tasks_own_retries(clusters: Clusters) -> None:
    cluster = clusters(limit=1, extra_conf=FAST)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=2, extra=["-E"])
    blocker = block(cluster)
    ok = cluster.app_module.flaky.delay(3)  # fails 3 times, then succeeds (max_retries=3)
    bad = cluster.app_module.flaky.delay(4)  # fails 4 times: one more than max_retries

    def waited(n: int) -> bool:
        return all(len(events.received_retries(r.id)) > n for r in (ok, bad))

    cluster.wait_for(lambda: waited(10), 30, "10 waits of each task")
    assert cluster.events() == []  # nothing ran without the permit
    assert ok.state == "RETRY"
    blocker.release()

    assert ok.get(timeout=30) == 3
    with pytest.raises(RuntimeError, match="flaky"):
        bad.get(timeout=30)
    # The body saw its own retry count only, and max_retries applied to it alone.
    assert starts(cluster, ok.id) == [0, 1, 2, 3]
    assert starts(cluster, bad.id) == [0, 1, 2, 3]
    # Monitors saw request.retries grow by one per delivery: waits plus own retries.
    for result in (ok, bad):
        seen = events.received_retries(result.id)
        assert seen == list(range(len(seen)))
        assert len(seen) >= 10 + 4
        last_start = [e for e in cluster.events() if e["id"] == result.id][-1]
        assert last_start["retries"] == 3  # what the body saw, not the total


def test_own_retry_goes_to_the_back_of_the_line_with_a_fresh_wait_budget(
    clusters: Clusters,
) -> None:
    """A task that ran and retries on its own error is a new contender: it lines up
    behind those that queued meanwhile (as Celery's retry goes to the back of the
    queue), and its wait budget (3 s here) starts again."""
    cluster = clusters(limit=1, extra_conf=FAST)
    cluster.worker("w1", concurrency=3)
    blocker = block(cluster)
    flaky = cluster.app_module.flaky_budget.delay(1)  # fails once
    holds = [cluster.app_module.hold.delay(0.4, i) for i in range(4)]
    time.sleep(2.0)  # first wait period: 2 s of the 3 s budget
    blocker.release()
    assert flaky.get(timeout=30) == 1  # second wait period: behind 4 holds, 1.6 to ~2.4 s
    assert [h.get(timeout=30) for h in holds] == list(range(4))
    records = sorted(cluster.events(), key=lambda e: e["at"])
    order = [e["id"] for e in records if e["event"] == "start"]
    assert order == [flaky.id, *(h.id for h in holds), flaky.id]
    assert starts(cluster, flaky.id) == [0, 1]


@pytest.mark.parametrize(
    ("mode", "setting", "value"),
    [
        ("countdown", "semaphore_max_waits", 3),
        ("countdown", "semaphore_max_wait_time", 1.0),
        ("handover", "semaphore_max_wait_time", 1.0),
    ],
)
def test_wait_budget_fails_the_task_and_gives_up_its_place(
    clusters: Clusters, mode: str, setting: str, value: float
) -> None:
    conf = FAST if mode == "countdown" else PARKING
    cluster = clusters(limit=1, extra_conf={**conf, setting: value})
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=1, extra=["-E"])
    block(cluster)
    result = cluster.app_module.hold.delay(0.1, "late")
    started = time.monotonic()
    with pytest.raises(SemaphoreTimeout) as caught:
        result.get(timeout=30)
    elapsed = time.monotonic() - started
    status = cluster.semaphore("hold", 1).status()  # at once: a kept place would still be live

    error = caught.value
    assert (error.name, error.limit) == ("hold", 1)
    waits = len(events.received_retries(result.id)) - 1
    pattern = (
        r"no permit of semaphore 'hold' \(limit 1\) was granted after waiting (\d+\.\d)s: "
        rf"task limited_app\.hold\[{result.id}\] gave up after {waits} waits"
    )
    match = re.match(pattern, str(error))
    assert match, str(error)
    assert float(match.group(1)) == pytest.approx(error.waited, abs=0.06)
    if setting == "semaphore_max_waits":
        assert waits == 3
        assert error.waited < elapsed
    elif mode == "countdown":
        assert waits > 3  # ~0.1 s per wait
        assert value <= error.waited < value + 1.0
    else:  # parked once, handed over when the budget ran out (by the next heartbeat)
        assert waits == 1
        assert value <= error.waited < value + 1.0
    assert result.id not in [w.holder for w in status.waiters]
    assert [h.holder for h in status.holders] == ["test-blocker-hold"]
    assert cluster.events() == []


def test_backoff_is_capped_by_backoff_max_even_when_the_turn_is_far(clusters: Clusters) -> None:
    """With long holds the estimated turn of the 6th in line is ~8 s away; each
    countdown (an ETA the worker holds unacked, so it must stay far below the
    broker's visibility_timeout) is still capped at semaphore_backoff_max."""
    cap = 0.5
    cluster = clusters(
        limit=1,
        extra_conf={
            "semaphore_wait_mode": "countdown",
            "semaphore_backoff_max": cap,
            "semaphore_max_block": 0.0,
        },
    )
    sem = cluster.semaphore("hold", 1)
    warm = block(cluster)  # a 1.5 s hold teaches the semaphore its hold time
    time.sleep(1.5)
    warm.release()
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=3, extra=["-E"])
    blocker = block(cluster)
    results = [cluster.app_module.hold.delay(0.05, i) for i in range(6)]
    cluster.wait_for(
        lambda: all(len(eta_countdowns(events, r.id)) >= 3 for r in results), 30, "3 waits each"
    )
    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(6))
    countdowns = [c for r in results for c in eta_countdowns(events, r.id)]
    assert max(countdowns) <= cap + 0.05, countdowns
    assert min(countdowns) > 0
    assert sem.status().waiter_count == 0


def test_tasks_start_in_submission_order(clusters: Clusters) -> None:
    cluster = clusters(limit=1, extra_conf={"semaphore_backoff_max": 0.5})
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    blocker = block(cluster)
    results = [cluster.app_module.hold.delay(0.1, i) for i in range(10)]
    cluster.wait_for(lambda: cluster.waiters() == 10, 10, "all 10 in line")
    time.sleep(1.0)  # every task has been refused at least once
    blocker.release()
    assert [r.get(timeout=60) for r in results] == list(range(10))
    order = starts_in_order(cluster)
    assert len(order) == 10
    assert kendall_tau(order) >= 0.9, order
    assert max_overlap(cluster.events()) == 1


def test_a_lapsed_place_is_regained_with_the_ticket_taken_at_publish(
    clusters: Clusters, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Odd tasks reach a worker first, after the places taken at publish lapsed;
    even ones come later but present their tickets, and still go first in turn."""
    monkeypatch.setattr(publish, "PLACE_AT_PUBLISH", 0.3)
    cluster = clusters(limit=1, extra_conf=FAST)
    blocker = block(cluster)
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.05, i), queue="odd" if i % 2 else "even") for i in range(10)]
    time.sleep(0.6)
    assert cluster.waiters() == 0  # every place lapsed
    cluster.worker("w1", concurrency=2, queues="odd")
    cluster.wait_for(lambda: cluster.waiters() == 5, 20, "the odd ones in line")
    cluster.worker("w2", concurrency=2, queues="even")
    cluster.wait_for(lambda: cluster.waiters() == 10, 20, "all in line")
    line = [w.holder for w in cluster.semaphore("hold", 1).status().waiters]
    assert line == [r.id for r in results]  # in line by ticket, not by arrival
    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(10))
    assert kendall_tau(starts_in_order(cluster)) >= 0.9


@pytest.mark.parametrize("mode", ["countdown", "handover"])
def test_per_key_caps_are_independent(clusters: Clusters, mode: str) -> None:
    cluster = clusters(limit=1, extra_conf=FAST if mode == "countdown" else PARKING)
    cluster.worker("w1", concurrency=3)
    per_customer = cluster.app_module.per_customer
    blocker = block(cluster, "customer-A")
    a = per_customer.delay("A", 0.1, "a")
    b1, b2 = per_customer.delay("B", 0.4, "b1"), per_customer.delay("B", 0.4, "b2")
    assert [b1.get(timeout=20), b2.get(timeout=20)] == ["b1", "b2"]  # A's cap doesn't block B
    assert not cluster.started(a.id)
    assert cluster.waiters("customer-A") == 1
    b_runs = intervals(cluster.events(), {b1.id, b2.id})
    assert len(b_runs) == 2
    assert b_runs[0][1] <= b_runs[1][0] or b_runs[1][1] <= b_runs[0][0]  # B's own cap is 1
    blocker.release()
    assert a.get(timeout=20) == "a"


def test_semaphore_redis_unreachable_policies(clusters: Clusters) -> None:
    """An outage of a semaphore Redis that answered when the worker started."""
    cluster = clusters(limit=1)
    with RedisServer() as server:
        port = server.port
        cluster.env["CS_SEMAPHORE_REDIS_URL"] = server.url
        events = clusters.events(cluster)
        cluster.worker("w1", concurrency=2, app="policy_app", queues="policy", extra=["-E"])
        server.stop()
        send = cluster.app_module.app.send_task

        ran = send("policy_app.guarded_run", args=["run"], queue="policy")
        assert ran.get(timeout=20) == "run"  # "run": runs without a permit

        failed = send("policy_app.guarded_fail", args=["fail"], queue="policy")
        with pytest.raises(
            SemaphoreConnectionError, match=rf"Redis at redis://127\.0\.0\.1:{port}"
        ):
            failed.get(timeout=20)

        budget = send("policy_app.guarded_budget", args=["budget"], queue="policy")
        with pytest.raises(SemaphoreTimeout, match="gave up after 2 waits"):
            budget.get(timeout=20)  # its wait budget, not the Redis outage, ends it

        waiting = send("policy_app.guarded_retry", args=["retry"], queue="policy")
        cluster.wait_for(
            lambda: len(events.received_retries(waiting.id)) >= 5, 20, "5 attempts of the task"
        )
        assert waiting.state == "RETRY"
        assert [e["tag"] for e in cluster.events() if e["event"] == "start"] == ["run"]

        server.start()  # the semaphore's Redis comes back on its port
        assert waiting.get(timeout=30) == "retry"
        assert cluster.started(waiting.id)


def test_a_semaphore_redis_never_reached_fails_tasks_at_once(clusters: Clusters) -> None:
    """A semaphore Redis that has not answered since the worker started is a setting to
    fix (a wrong URL, a server not running), not an outage: "retry" fails the task at
    once instead of retrying it forever, and the worker said why when it started. Once
    it has answered a task, a later outage is waited out again."""
    cluster = clusters(limit=1)
    with RedisServer() as server:
        port = server.port
        server.stop()  # down before the worker starts
        cluster.env["CS_SEMAPHORE_REDIS_URL"] = server.url
        events = clusters.events(cluster)
        worker = cluster.worker(
            "w1", concurrency=2, app="policy_app", queues="policy", extra=["-E"]
        )
        assert f"the semaphores' store at {server.url} does not answer" in worker.text()
        send = cluster.app_module.app.send_task

        started = time.monotonic()
        failed = send("policy_app.guarded_retry", args=["never"], queue="policy")
        with pytest.raises(
            SemaphoreConnectionError, match=rf"Redis at redis://127\.0\.0\.1:{port}"
        ):
            failed.get(timeout=20)
        assert time.monotonic() - started < 10
        assert not cluster.started(failed.id)
        assert "has not answered this worker since it started" in worker.text()

        server.start()  # it comes up: a task gets an answer
        assert send("policy_app.guarded_retry", args=["up"], queue="policy").get(timeout=20) == "up"
        server.stop()  # an outage now: waited out, in whichever pool process
        waiting = [send("policy_app.guarded_retry", args=[n], queue="policy") for n in range(2)]
        cluster.wait_for(
            lambda: all(len(events.received_retries(w.id)) >= 3 for w in waiting),
            20,
            "3 attempts of each task",
        )
        assert [w.state for w in waiting] == ["RETRY", "RETRY"]
        server.start()
        assert [w.get(timeout=30) for w in waiting] == [0, 1]
