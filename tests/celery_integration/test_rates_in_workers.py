"""Rates in real ``celery worker`` processes (celery_apps/limited_app.py).

What an observer sees from the task bodies' own records: starts never faster than
the rate across workers, the concurrency limit and the rate together, a rate per
account, and `RateLimited` pausing the line with the raising task first after it,
in both wait modes; and from the broker, the messages the workers hold while a
rate's line waits. Tolerant bounds; the tight figures are benchmarks/bench_rate.py's.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery_harness import max_overlap
from cluster_tools import Clusters

from celery_semaphore import Semaphore
from devkit.measures import kendall_tau
from devkit.redis_servers import RedisClusterServers

pytestmark = pytest.mark.slow

WORKER = {"concurrency": 2}


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def starts(events: list[dict[str, Any]], ids: set[str] | None = None) -> list[dict[str, Any]]:
    found = [e for e in events if e["event"] == "start" and (ids is None or e["id"] in ids)]
    return sorted(found, key=lambda e: e["at"])


def most_in_window(times: list[float], window: float) -> int:
    return max(sum(1 for t in times[i:] if t < start + window) for i, start in enumerate(times))


class HeldSampler:
    """Every 50 ms, how many messages the workers hold: the Redis transport's
    ``unacked`` hash (delivered, not acked: prefetched, waiting in place, countdown
    retries), as benchmarks/bench_rate.py samples it."""

    def __init__(self, broker_url: str) -> None:
        self.broker = redis.Redis.from_url(broker_url)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="held-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(self.broker.hlen("unacked"))

    def __enter__(self) -> HeldSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.broker.close()


@pytest.mark.parametrize("task", ["paced", "paced_countdown"])
def test_a_rate_holds_across_workers_in_order(clusters: Clusters, task: str) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER)
    paced = getattr(cluster.app_module, task)
    with HeldSampler(cluster.broker_url) as held:
        results = [paced.delay(0.01, i) for i in range(60)]
        assert [r.get(timeout=60) for r in results] == list(range(60))
    begun = starts(cluster.events())
    assert len(begun) == 60, "each task ran once"
    times = [e["at"] for e in begun]
    most = most_in_window(times, 1.0)
    assert most <= 22, f"{most} starts in a second: 20/s, burst 1 (+1: the bodies' own jitter)"
    rate = (len(times) - 1) / (times[-1] - times[0])
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(times))
    assert 12 <= rate <= 21, f"{rate:.1f} starts/s under 20/s with a backlog; gaps {gaps[-5:]}"
    assert kendall_tau([e["tag"] for e in begun]) >= 0.9, "in submission order"
    waits = sum(e["retries"] for e in begun) / len(begun)
    assert waits <= 2.5, f"{waits:.2f} waits per task"
    peak = max(held.samples)
    assert peak >= 1, "the sampler sees the messages the workers hold"
    if task == "paced":  # handover: the rest of the line is parked in Redis, not held
        processes = 2 * WORKER["concurrency"]
        assert peak <= 2 * processes + 2, f"{peak} messages held by {processes} processes"


def test_the_limit_and_the_rate_of_one_semaphore_together(clusters: Clusters) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)
    both = cluster.app_module.both
    results = [both.delay(0.2, i) for i in range(30)]
    assert [r.get(timeout=60) for r in results] == list(range(30))
    events = cluster.events()
    assert max_overlap(events) <= 3, "limit 3"
    times = [e["at"] for e in starts(events)]
    assert most_in_window(times, 1.0) <= 12, "10/s"
    assert times[-1] - times[0] >= 2.7, "30 starts at 10/s take 2.9 s at the least"
    # the rate binds (limit 3 of 0.2 s bodies would allow 15/s): 2.9 s of starts, then
    # the last body; from the first start, so the workers' start-up is not counted
    makespan = max(e["at"] for e in events if e["event"] == "end") - times[0]
    assert makespan <= 1.5 * (2.9 + 0.2) + 3, f"{makespan:.1f} s: the rate allows 3.1 s"


def test_a_rate_per_account(clusters: Clusters) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER)
    per_account = cluster.app_module.per_account
    results = [per_account.delay(account, 0.01, f"{account}{i}") for i in range(8)
               for account in ("a", "b")]  # fmt: skip
    for result in results:
        result.get(timeout=60)
    begun = starts(cluster.events())
    for account in ("a", "b"):
        times = [e["at"] for e in begun if e["tag"].startswith(account)]
        assert len(times) == 8
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert min(gaps) >= 0.1 - 0.02, f"account {account}: 5/s, with a late-grant credit"
    first_a = [e["at"] for e in begun if e["tag"].startswith("a")]
    first_b = [e["at"] for e in begun if e["tag"].startswith("b")]
    assert abs(first_a[-1] - first_b[-1]) < 1.0, "the accounts do not wait for each other"


def pause_start(cluster: Any, name: str, seconds: float) -> float:
    """When the last pause of ``name``'s rate began (the Redis server's time)."""
    until_ms = cluster.redis.hget(cluster.semaphore(name).keys.meta, "rate_pause")
    return int(until_ms) / 1000 - seconds


@pytest.mark.parametrize(
    "task", ["slow_down", "slow_down_countdown", "slow_down_long", "slow_down_capped"]
)
def test_rate_limited_pauses_the_line_and_its_task_goes_first(
    clusters: Clusters, task: str
) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER)
    slow_down = getattr(cluster.app_module, task)
    results = [slow_down.delay(i, 1.0 if i == 3 else 0.0) for i in range(20)]
    assert [r.get(timeout=60) for r in results] == list(range(20)), "max_retries=0: not spent"
    events = cluster.events()
    (raised,) = [e for e in events if e["event"] == "rate-limited"]
    paused = pause_start(cluster, slow_down.semaphore, 1.0)
    assert raised["at"] - 0.01 <= paused, "paused after 3 raised"
    # by grant, the Redis server's time: under load a body may begin long after its
    # grant, and a rate may grant its next turn between the raise and the pause
    granted = sorted(starts(events), key=lambda e: e["granted"])
    before = [e for e in granted if e["granted"] <= paused]
    after = [e for e in granted if e["granted"] > paused]
    tags = [e["tag"] for e in before]
    assert tags == sorted(tags) and 3 in tags, f"in order up to the pause: {tags}"
    if slow_down.limit == 1:  # 3 held the one permit: only its release could grant
        late = [e["tag"] for e in before if e["granted"] > raised["at"]]
        assert not late, f"the release of 3's permit handed a turn on before the pause: {late}"
    assert after, "tasks granted after the pause"
    assert after[0]["tag"] == 3, f"the task that raised goes first after the pause: {after}"
    assert after[0]["granted"] - paused >= 1.0 - 0.002, "no grant within the 1 s pause"
    assert after[0]["granted"] - paused < 3.0, "it comes back when the pause ends"
    assert after[0]["retries"] == 0, "its body sees its own retries, not its waits"
    tags = [e["tag"] for e in after[1:]]
    assert tags == sorted(tags), "the line resumes in order"
    ran = [e["tag"] for e in granted]
    assert sorted(ran) == sorted([*range(20), 3]), "each once, and 3 again after the pause"


def test_shadow_limits_change_nothing_and_count_what_they_would_have_done(
    clusters: Clusters,
) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER)
    shadowed = cluster.app_module.shadowed
    results = [shadowed.delay(0.3, i) for i in range(12)]
    assert [r.get(timeout=60) for r in results] == list(range(12))
    events = cluster.events()
    begun = starts(events)
    assert all(e["retries"] == 0 for e in begun), "nobody waited"
    assert max_overlap(events) >= 3, "more than the shadow limit of 1 ran at once"
    times = [e["at"] for e in begun]
    assert most_in_window(times, 1.0) > 6, "more than the shadow rate of 5/s started"
    meta = cluster.redis.hgetall(cluster.semaphore("shadowed").keys.meta)
    over_limit, over_rate = int(meta[b"m_shadow_limit"]), int(meta[b"m_shadow_rate"])
    # A start counts where permits were held or places stood ahead of it (a task published
    # earlier, still on its way: an enforced limit of 1 would have kept the permit for
    # it), so even the first start may count: at most one count a start.
    assert 3 <= over_limit <= 12, "the starts that found the shadow limit full"
    assert over_rate >= 5, "the starts ahead of the shadow rate's schedule"
    assert int(meta[b"m_shadow_wait_ms"]) > 0


def test_a_shadow_limit_beside_an_enforced_rate_holds_back_nothing_but_the_rate(
    clusters: Clusters,
) -> None:
    """Tasks wait for the rate (10/s) and for nothing else: the line the rate forms moves
    past the shadow limit of 1 (tasks parked and waiting are handed over and woken by
    the rate alone), so they overlap as they would without it, and it counts them."""
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=4)
    task = cluster.app_module.half_shadowed
    results = [task.delay(0.6, i) for i in range(12)]
    assert [r.get(timeout=60) for r in results] == list(range(12))
    events = cluster.events()
    times = [e["at"] for e in starts(events)]
    assert max_overlap(events) >= 4, "the shadow limit of 1 held the tasks back"
    span = times[-1] - times[0]
    assert span >= 1.1 - 0.1 - 0.05, f"12 starts at 10/s in {span:.2f} s: the rate held"
    assert span < 2.5, f"12 starts at 10/s took {span:.2f} s (1.1 s, unheld)"
    meta = cluster.redis.hgetall(cluster.semaphore("half-shadowed").keys.meta)
    assert int(meta[b"m_shadow_limit"]) >= 4, "the starts that found the shadow limit full"


def test_a_queue_rate_paces_every_task_of_the_queue(clusters: Clusters) -> None:
    cluster = clusters(extra_conf={"semaphore_queue_rates": {"emails": "5/s"}})
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2, queues="emails,default")
    plain = cluster.app_module.plain
    paced = [plain.apply_async((0.01, f"e{i}"), queue="emails") for i in range(8)]
    free = [plain.apply_async((0.01, f"d{i}"), queue="default") for i in range(8)]
    for result in paced + free:
        result.get(timeout=60)
    begun = starts(cluster.events())
    emails = [e["at"] for e in begun if e["tag"].startswith("e")]
    others = [e["at"] for e in begun if e["tag"].startswith("d")]
    assert len(emails) == 8 and len(others) == 8
    # 5/s for every task of the queue, plain ones too. What the rate promises (common_rates.lua,
    # rate_tat()): at most count + burst grants in any second, and a grant up to half an
    # interval late keeps the schedule, so two starts may come 0.1 s apart; not a 0.2 s gap.
    most = most_in_window(emails, 1.0)
    assert most <= 7, f"{most} starts in a second: 5/s, burst 1 (+1: the bodies' own jitter)"
    span = emails[-1] - emails[0]
    assert span >= 1.4 - 0.1 - 0.1, f"8 starts at 5/s in {span:.2f}s (1.4 s, less a late first)"
    gaps = [later - earlier for earlier, later in itertools.pairwise(emails)]
    assert min(gaps) >= 0.1 - 0.02, f"5/s, with a late-grant credit: gaps {gaps}"
    other_gaps = [later - earlier for earlier, later in itertools.pairwise(others)]
    assert min(other_gaps) < 0.2 - 0.03, "other queues are not paced"
    status = cluster.semaphore("queue:emails").status()
    assert str(status.rate) == "5/s" and status.holder_count == 0


def test_the_limit_and_the_rate_together_with_the_semaphores_on_redis_cluster(
    clusters: Clusters, redis_cluster: RedisClusterServers
) -> None:
    """The broker a plain Redis, the semaphores a Redis Cluster: one semaphore's limit
    and rate live on one slot and are granted by one script there."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    cluster = clusters(extra_conf={"semaphore_redis_url": url})
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)
    both = cluster.app_module.both
    results = [both.delay(0.2, i) for i in range(20)]
    assert [r.get(timeout=60) for r in results] == list(range(20))
    events = cluster.events()
    assert max_overlap(events) <= 3, "limit 3"
    begun = starts(events)
    times = [e["at"] for e in begun]
    assert most_in_window(times, 1.0) <= 12, "10/s"
    assert kendall_tau([e["tag"] for e in begun]) >= 0.9
    sem = Semaphore(url, "both", 3)
    try:
        status = sem.status()
    finally:
        sem.close()
    assert str(status.rate) == "10/s" and status.holder_count == 0


def weighted_peak(events: list[dict[str, Any]]) -> int:
    """Most permits in use at once: each body counts its weight (the tag's first part)."""
    changes = sorted(
        (e["at"], int(e["tag"].split("-")[0]) * (1 if e["event"] == "start" else -1))
        for e in events
        if e["event"] in ("start", "end")
    )
    level = peak = 0
    for _, change in changes:
        level += change
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("wait_mode", ["handover", "countdown"])
def test_weights_in_workers_never_over_the_limit_and_in_order(
    clusters: Clusters, wait_mode: str
) -> None:
    cluster = clusters(extra_conf={"semaphore_wait_mode": wait_mode})
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)
    weighed = cluster.app_module.weighed
    weights = [3, 1, 2, 4, 1, 1, 2, 3, 1, 2, 4, 1]
    results = [weighed.delay(w, 0.2, f"{w}-{i}") for i, w in enumerate(weights)]
    assert [r.get(timeout=60) for r in results] == [f"{w}-{i}" for i, w in enumerate(weights)]
    events = cluster.events()
    assert weighted_peak(events) <= 4, "never more than 4 permits in use"
    assert max_overlap(events) >= 2, "light ones run together"
    begun = [int(e["tag"].split("-")[1]) for e in starts(events)]
    assert kendall_tau(begun) >= 0.8, f"in line order, a heavy head holding back: {begun}"
    assert cluster.holders("weighed") == 0, "every seat given back"


def test_a_rate_weight_counts_a_batch_as_that_many_starts(clusters: Clusters) -> None:
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER)
    batch = cluster.app_module.batch
    rows = [3, 1, 2, 3, 1, 3, 2, 1, 3, 1]  # 20 starts' worth at 10/s, burst 3
    results = [batch.delay(n, 0.01, f"{n}-{i}") for i, n in enumerate(rows)]
    for result in results:
        result.get(timeout=60)
    begun = starts(cluster.events())
    assert len(begun) == len(rows)
    times = [e["at"] for e in begun]
    spent = [int(e["tag"].split("-")[0]) for e in begun]
    most = max(
        sum(n for t, n in zip(times, spent, strict=True) if start <= t < start + 1.0)
        for start in times
    )
    assert most <= 10 + 3 + 1, f"{most} rows started in a second: 10/s, burst 3 (+1: jitter)"
    assert times[-1] - times[0] >= (sum(rows) - 3) / 10 - 0.2, "the rows, not the calls, pace it"


def test_rate_limited_naming_one_rate_pauses_that_one_only(clusters: Clusters) -> None:
    """``RateLimited(4, limit="named-a")`` from a task with rates on named-a and named-b:
    named-a starts nobody for 4 s and the raiser is its first start after the pause;
    named-b goes on meanwhile. The pause shows in named-a's status and as a
    ``semaphore-rate-limited`` event naming named-a only."""
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER, extra=["-E"])
    seen = clusters.events(cluster)
    module = cluster.app_module
    raiser = module.slow_down_named.delay("raiser", 4.0)
    cluster.wait_for(
        lambda: any(e["event"] == "rate-limited" for e in cluster.events()), 30, "the raise"
    )
    readers = [Semaphore(cluster.redis, name, rate="20/s") for name in ("named-a", "named-b")]
    try:
        paused = [reader.status().rate_paused_until for reader in readers]
    finally:
        for reader in readers:
            reader.close()
    assert paused[0] is not None and paused[1] is None, paused
    a_tasks = [module.named_a.delay(0.01, f"a{i}") for i in range(3)]
    b_tasks = [module.named_b.delay(0.01, f"b{i}") for i in range(3)]
    for result in a_tasks + b_tasks:
        result.get(timeout=60)
    assert raiser.get(timeout=60) == "raiser", "max_retries=0: the pause is not a retry of its own"
    events = cluster.events()
    (raised,) = [e for e in events if e["event"] == "rate-limited"]
    later = [e for e in starts(events) if e["at"] > raised["at"]]
    on_a = [e["tag"] for e in later if e["tag"] == "raiser" or e["tag"].startswith("a")]
    assert sorted(on_a) == ["a0", "a1", "a2", "raiser"] and on_a[0] == "raiser", on_a
    since = {e["tag"]: e["at"] - raised["at"] for e in later}
    assert all(since[tag] >= 4.0 - 0.05 for tag in on_a), f"named-a started in its pause: {since}"
    assert since["raiser"] < 4.0 + 3.0, "the raiser comes back when the pause ends"
    assert all(since[f"b{i}"] < 4.0 for i in range(3)), f"named-b is not paused: {since}"
    cluster.wait_for(
        lambda: any(e["type"] == "semaphore-rate-limited" for e in seen.snapshot()), 10, "event"
    )
    limited = [e for e in seen.snapshot() if e["type"] == "semaphore-rate-limited"]
    assert [(e["uuid"], e["semaphore"], e["retry_after"]) for e in limited] == [
        (raiser.id, "named-a", 4.0)
    ]


def test_rate_limited_without_that_rate_fails_the_task_saying_so(clusters: Clusters) -> None:
    """A body that raises `RateLimited` naming a rate its task does not declare, or whose
    task declares no rate at all, fails with a ValueError that says so, holding nothing."""
    cluster = clusters()
    cluster.worker("w1", **WORKER)
    module = cluster.app_module
    with pytest.raises(ValueError, match=r"but its rates are on named-b: declare rate="):
        module.slow_down_misnamed.delay().get(timeout=60)
    with pytest.raises(ValueError, match=r"but it declares no rate: declare rate="):
        module.slow_down_unrated.delay().get(timeout=60)
    assert cluster.holders("unrated") == 0
    reader = Semaphore(cluster.redis, "named-b", rate="20/s")
    try:
        status = reader.status()
    finally:
        reader.close()
    assert (status.holder_count, status.rate_paused_until) == (0, None)


def test_shadow_refusals_are_sent_as_events_one_per_counted_grant(clusters: Clusters) -> None:
    """With ``-E`` every grant a shadow limit would have refused is a
    ``semaphore-shadow-refused`` event naming the limits; the events agree with the
    semaphore's own counters, and a shadow rate's event says how long it would have
    delayed the start."""
    cluster = clusters()
    for name in ("w1", "w2"):
        cluster.worker(name, **WORKER, extra=["-E"])
    seen = clusters.events(cluster)
    results = [cluster.app_module.shadowed.delay(0.3, i) for i in range(8)]
    assert [r.get(timeout=60) for r in results] == list(range(8))
    meta = cluster.redis.hgetall(cluster.semaphore("shadowed").keys.meta)
    counted = {kind: int(meta.get(f"m_shadow_{kind}".encode(), 0)) for kind in ("limit", "rate")}
    assert counted["limit"] >= 1 and counted["rate"] >= 1, counted

    def shadow_events() -> list[dict[str, Any]]:
        return [e for e in seen.snapshot() if e["type"] == "semaphore-shadow-refused"]

    def told(kind: str) -> int:
        return sum(kind in e["limits"] for e in shadow_events())

    cluster.wait_for(
        lambda: (told("limit"), told("rate")) == (counted["limit"], counted["rate"]),
        10,
        f"one event per counted grant: {counted}",
    )
    ids = {r.id for r in results}
    assert all(e["uuid"] in ids and e["semaphore"] == "shadowed" for e in shadow_events())
    assert all(e["would_wait"] > 0 for e in shadow_events() if "rate" in e["limits"])
