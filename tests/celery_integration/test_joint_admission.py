"""Several limits of one task granted in one step, in real ``celery worker`` processes.

A task with limits on two semaphores takes both permits in one script call or
neither: it never takes one and gives it back because the other was full (which
the semaphore's own grant counter would show), it waits with one ticket in the
line that refused it, and it starts when both are free, in line order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters

from celery_semaphore import Semaphore
from devkit.measures import kendall_tau
from devkit.redis_servers import RedisClusterServers

pytestmark = pytest.mark.slow


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def granted_count(cluster: Any, name: str) -> int:
    return int(cluster.redis.hget(cluster.semaphore(name).keys.meta, "m_granted") or 0)


@pytest.mark.parametrize("wait_mode", ["handover", "countdown"])
def test_a_task_never_takes_one_limit_while_the_other_is_full(
    clusters: Clusters, wait_mode: str
) -> None:
    cluster = clusters(extra_conf={"semaphore_wait_mode": wait_mode})
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)
    module = cluster.app_module
    blockers = [module.b_only.delay(1.5, f"b{i}") for i in range(2)]  # pair-b full for 1.5 s
    cluster.wait_for(lambda: cluster.holders("pair-b") == 2, 10, "pair-b full")
    pairs = [module.pair.delay(0.2, i) for i in range(6)]
    time.sleep(0.5)
    assert granted_count(cluster, "pair-a") == 0, "no pair-a permit taken while pair-b is full"
    assert [r.get(timeout=60) for r in pairs] == list(range(6))
    for blocker in blockers:
        blocker.get(timeout=60)
    events = cluster.events()
    pair_starts = sorted(
        (e for e in events if e["event"] == "start" and e["task"].endswith(".pair")),
        key=lambda e: e["at"],
    )
    # in the order of the grants (the Redis server's time, the later of the two): a
    # handed-over task's body may begin well after its grant on a loaded machine
    by_grant = sorted(pair_starts, key=lambda e: max(e["granted"].values()))
    tags = [e["tag"] for e in by_grant]
    assert sorted(tags) == list(range(6))
    seen = [(e["tag"], e["granted"], round(e["at"], 3), e["retries"]) for e in by_grant]
    if wait_mode == "handover":
        # two permits free at once are handed over together: either may be granted first
        assert all(abs(i - tag) <= 1 for i, tag in enumerate(tags)), f"in line order: {seen}"
    else:
        # countdown retries fire late under load and a lapsed place stops holding back
        # later tickets (guarantees.md, "Strict FIFO only among live places"): mostly in
        # order here; among live places the order is exact (tests/conformance)
        assert kendall_tau(tags) >= 0.6, f"in line order, mostly: {seen}"
    assert granted_count(cluster, "pair-a") == 6, "pair-a granted once per start, never given back"
    first_pair = pair_starts[0]["at"]
    freed = min(e["at"] for e in events if e["event"] == "end" and e["task"].endswith("b_only"))
    assert first_pair >= freed - 0.05, "the pairs waited for pair-b, holding nothing"
    assert max_overlap([e for e in events if e["task"].endswith(".pair")]) <= 2


def test_on_redis_cluster_two_names_are_taken_one_after_the_other_with_a_warning(
    clusters: Clusters, redis_cluster: RedisClusterServers
) -> None:
    """Each semaphore's keys are in a slot of their own: one script cannot take both,
    so the worker says so and takes them one after the other, holding neither while
    it waits for the other."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    cluster = clusters(extra_conf={"semaphore_redis_url": url})
    worker = cluster.worker("w1", concurrency=3)
    pairs = [cluster.app_module.pair.delay(0.1, i) for i in range(6)]
    assert [r.get(timeout=60) for r in pairs] == list(range(6))
    assert max_overlap(cluster.events()) <= 2
    assert "are taken one after the other, not in one step" in worker.text()
    assert "one Redis Cluster slot" in worker.text()


def test_on_redis_cluster_a_namespace_with_a_hash_tag_takes_them_in_one_step(
    clusters: Clusters, redis_cluster: RedisClusterServers
) -> None:
    """``semaphore_namespace = "cs{limits}"``: every semaphore on one slot, so a task's
    two limits are one script call there too (nothing taken while the other is full)."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    namespace = "cs{limits}"
    cluster = clusters(extra_conf={"semaphore_redis_url": url, "semaphore_namespace": namespace})
    worker = cluster.worker("w1", concurrency=4)
    module = cluster.app_module
    pair_a = Semaphore(url, "pair-a", 2, namespace=namespace)
    pair_b = Semaphore(url, "pair-b", 2, namespace=namespace)
    try:
        blockers = [module.b_only.delay(1.0, f"b{i}") for i in range(2)]
        cluster.wait_for(lambda: pair_b.status().holder_count == 2, 10, "pair-b full")
        pairs = [module.pair.delay(0.1, i) for i in range(4)]
        time.sleep(0.4)
        assert pair_a.client.hget(pair_a.keys.meta, "m_granted") is None, "nothing taken"
        assert [r.get(timeout=60) for r in pairs] == list(range(4))
        for blocker in blockers:
            blocker.get(timeout=60)
        assert int(pair_a.client.hget(pair_a.keys.meta, "m_granted")) == 4
        assert "not in one step" not in worker.text()
    finally:
        pair_a.close()
        pair_b.close()


def most_in_window(times: list[float], window: float) -> int:
    return max(sum(1 for t in times[i:] if t < start + window) for i, start in enumerate(times))


@pytest.mark.parametrize("namespace", [None, "cs{limits}"], ids=["a slot each", "one slot"])
def test_on_redis_cluster_a_cap_and_a_rate_on_two_names_hold_together(
    clusters: Clusters, redis_cluster: RedisClusterServers, namespace: str | None
) -> None:
    """A concurrency limit on one name and a rate on another, the semaphores on a Redis
    Cluster. In a slot each they are taken one after the other (the rate last, with a
    WARNING); with a hash tag in the namespace in one step (the cap granted once per
    start, never given back). Either way: never more than the cap running, never more
    starts in a second than the rate allows, every task once."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    conf: dict[str, Any] = {"semaphore_redis_url": url}
    where: dict[str, Any] = {}
    if namespace is not None:
        conf["semaphore_namespace"] = where["namespace"] = namespace
    cluster = clusters(extra_conf=conf)
    workers = [cluster.worker(name, concurrency=3) for name in ("w1", "w2")]
    # 24 tasks, not 16: the order's measure below varies less (at 16 it fell once to 0.22)
    total = 24
    results = [cluster.app_module.capped_and_paced.delay(0.35, i) for i in range(total)]
    assert [r.get(timeout=90) for r in results] == list(range(total))
    events = cluster.events()
    assert max_overlap(events) <= 2, "the cap, apart-cap: 2"
    begun = sorted((e for e in events if e["event"] == "start"), key=lambda e: e["at"])
    times = [e["at"] for e in begun]
    assert len(times) == total, "each task ran once"
    most = most_in_window(times, 1.0)
    assert most <= 5 + 1 + 1, f"{most} starts in a second: 5/s, burst 1 (+1: the bodies' jitter)"
    assert times[-1] - times[0] >= (total - 1) / 5 - 0.2, "starts at 5/s: (n - 1) / 5 s at least"
    # Each task asks at a worker first (two limits: none parks at publish) and parks in
    # the broker's ".asked" parking queue in the order the workers refused it, which six
    # pool processes racing shuffle: 0.53-0.57 under two test suites at once, above 0.6
    # alone (parked in Redis before, handed over in ticket order, it was above 0.6 always).
    tau = kendall_tau([e["tag"] for e in begun])
    assert tau >= 0.3, f"roughly in line order: tau {tau:.3f}"
    logs = "".join(worker.text() for worker in workers)
    assert ("are taken one after the other, not in one step" in logs) == (namespace is None)
    cap = Semaphore(url, "apart-cap", 2, **where)
    try:
        assert cap.status().holder_count == 0, "every permit given back"
        if namespace is not None:
            granted = int(cap.client.hget(cap.keys.meta, "m_granted"))
            assert granted == total, "one step: the cap granted once per start, never given back"
    finally:
        cap.close()
