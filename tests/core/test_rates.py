"""Rates in the semaphore core (sync and asyncio alike), on a real Redis.

A rate caps how fast permits are granted (GCRA on the server clock), in the same
script and the same line as the concurrency limit. Grant times are read from the
fencing tokens, which are the server's clock in microseconds when grants are spaced
further apart than a microsecond.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from outcomes import granted, refused

from celery_semaphore import Handover, RateLimit
from devkit.redis_servers import RedisClusterServers

MakeSemaphore = Callable[..., Any]


def most_in_window(times: list[float], window: float) -> int:
    ordered = sorted(times)
    return max(
        sum(1 for other in ordered[i:] if other < start + window) for i, start in enumerate(ordered)
    )


def test_grants_are_spaced_by_the_rate_and_keep_it(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate="50/s")
    grants: list[float] = []
    lock = threading.Lock()

    def contend(index: int) -> None:
        for round_ in range(10):
            permit = sem.acquire(timeout=10, holder=f"c{index}-{round_}")
            with lock:
                grants.append(permit.fencing_token / 1e6)
            permit.release()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(grants) == 60
    gaps = [b - a for a, b in itertools.pairwise(sorted(grants))]
    # a late grant keeps the schedule (up to half an interval): never closer than that
    assert min(gaps) >= 0.01 - 0.001, min(gaps)
    assert most_in_window(grants, 0.2) <= 11, "at most count x window + burst in any window"
    span = max(grants) - min(grants)
    assert 59 / span <= 51, f"{59 / span:.1f} grants/s over a 50/s rate"
    assert 59 / span >= 40, f"{59 / span:.1f} grants/s: far under the rate, with waiters"


def test_a_burst_is_granted_at_once_then_the_interval(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate=RateLimit(10, 1.0, burst=3))
    permits = [sem.attempt(f"b{i}") for i in range(4)]
    assert [type(p).__name__.endswith("Permit") for p in permits[:3]] == [True] * 3
    place = refused(permits[3])
    assert place.rate_due is not None and 0.05 < place.rate_due <= 0.1
    assert place.position == 1


def test_the_concurrency_limit_and_the_rate_are_one_step(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2, rate="5/s")
    first = granted(sem.attempt("a"))
    place = refused(sem.attempt("b"))  # a permit is free, the rate says 0.2 s
    assert place.rate_due is not None and 0.1 < place.rate_due <= 0.2
    assert place.holders == 1 and place.limit == 2
    time.sleep(place.rate_due + 0.01)
    second = granted(sem.attempt("b"))
    time.sleep(0.25)
    place = refused(sem.attempt("c"))  # the rate allows one now, the limit does not
    assert place.rate_due == 0 and place.holders == 2
    first.release()
    granted(sem.attempt("c"))
    second.release()


def test_the_line_is_served_in_order_across_rate_waits(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate="20/s")
    granted(sem.attempt("head"))
    places = {name: refused(sem.attempt(name)) for name in ("w1", "w2", "w3")}
    assert [p.position for p in places.values()] == [1, 2, 3]
    dues = [p.rate_due or 0 for p in places.values()]
    # the two asks are a few ms apart (more on a loaded machine): their slots 50 ms apart
    assert dues == sorted(dues) and 0.05 - 0.02 <= dues[1] - dues[0] <= 0.05
    order: list[str] = []
    lock = threading.Lock()

    def wait(name: str) -> None:
        permit = sem.acquire(timeout=5, holder=name, ticket=places[name].ticket)
        with lock:
            order.append(name)
        permit.release()

    threads = [threading.Thread(target=wait, args=(n,)) for n in ("w3", "w2", "w1")]
    for thread in threads:
        thread.start()
        time.sleep(0.005)
    for thread in threads:
        thread.join(10)
    assert order == ["w1", "w2", "w3"]
    assert refused(sem.attempt("late")).position == 1


def test_set_clear_and_pause_a_rate(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(5, rate="10/s")
    assert sem.status().rate == RateLimit(10)
    assert sem.set_rate("100/m") is None
    status = sem.status()
    assert (status.rate, status.rate_override) == (RateLimit(100, 60.0), RateLimit(100, 60.0))
    assert sem.set_rate("20/s") == RateLimit(100, 60.0)
    assert sem.clear_rate() == RateLimit(20)
    assert sem.status().rate == RateLimit(10)
    sem.pause_rate(0.4)
    paused_at = time.time()
    status = sem.status()
    assert status.rate_paused_until is not None
    assert status.rate_paused_until - status.server_time == pytest.approx(0.4, abs=0.05)
    place = refused(sem.attempt("p"))
    assert place.rate_due is not None and 0.3 < place.rate_due <= 0.4
    permit = sem.acquire(timeout=3, holder="p")
    assert time.time() - paused_at >= 0.38
    permit.release()
    assert sem.status().rate_paused_until is None


def test_a_set_rate_applies_where_none_was_declared(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(5)
    granted(sem.attempt("a"))
    sem.set_rate("2/s")
    granted(sem.attempt("b"))  # the first grant under the rate
    place = refused(sem.attempt("c"))
    assert place.rate_due is not None and place.rate_due > 0.4
    sem.clear_rate()
    granted(sem.attempt("c"))


def test_a_waiter_parked_under_a_slow_rate_is_handed_over_timed_for_its_slot(
    make_semaphore: MakeSemaphore,
) -> None:
    handed: list[Handover] = []
    sem = make_semaphore(None, rate="2/s", on_handover=handed.extend, handover_window=0.1)
    granted(sem.attempt("first"))
    place = refused(sem.attempt("second"))
    sem.park("second", "payload-2", place.ticket)
    sem.park("third", "payload-3", refused(sem.attempt("third")).ticket)
    assert [h.holder for h in handed] == ["second"], "only the next slot, and timed for it"
    assert handed[0].delay == pytest.approx(0.5, abs=0.05)
    time.sleep(handed[0].delay)
    granted(sem.attempt("second", handover=handed[0].token))
    assert [h.holder for h in handed] == ["second", "third"], "its grant hands over the next"
    assert handed[1].delay == pytest.approx(0.5, abs=0.05)


def test_status_shows_the_next_start(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate="4/s")
    status = sem.status()
    assert status.rate_room == 1
    granted(sem.attempt("a"))
    status = sem.status()
    assert status.rate_room == 0 and status.next_start_at is not None
    assert status.next_start_at - status.server_time == pytest.approx(0.25, abs=0.02)
    assert status.effective_limit == 1_000_000  # no concurrency cap


def test_limit_and_rate_on_redis_cluster(
    make_semaphore: MakeSemaphore, redis_cluster: RedisClusterServers
) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    for name in (f"api-{uuid.uuid4().hex[:6]}" for _ in range(3)):  # slots on several masters
        sem = make_semaphore(1, name=name, url=url, rate="10/s")
        first = granted(sem.attempt("a"))
        first.release()
        place = refused(sem.attempt("b"))
        assert place.rate_due is not None and 0.05 < place.rate_due <= 0.1
        time.sleep(place.rate_due)
        granted(sem.attempt("b"))
        assert refused(sem.attempt("c")).holders == 1


def test_a_permit_given_back_unused_gives_its_grant_back(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(None, rate="2/s")
    unused = granted(sem.attempt("a"))
    assert unused.give_back_unused()
    used = granted(sem.attempt("b"))  # at once: the first grant was given back
    assert used.release()
    place = refused(sem.attempt("c"))  # a used grant spends its interval
    assert place.rate_due is not None and place.rate_due > 0.4


def test_shadow_limits_count_and_refuse_nothing(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, rate="2/s", shadow=["limit", "rate"])
    first = granted(sem.attempt("a"))
    assert first.shadow_refused == frozenset()
    second = granted(sem.attempt("b"))  # over both: granted, and said so
    assert second.shadow_refused == {"limit", "rate"}
    assert second.shadow_wait == pytest.approx(0.5, abs=0.02)
    third = granted(sem.attempt("c"))
    assert third.shadow_wait == pytest.approx(1.0, abs=0.02), "the schedule moves on as enforced"
    status = sem.status()
    assert status.holder_count == 3 and status.waiter_count == 0, "nobody waits"
    counters = sem.client.hmget(sem.keys.meta, "m_shadow_limit", "m_shadow_rate")
    assert [int(c) for c in counters] == [2, 2]
    assert (status.shadow_limit_refusals, status.shadow_rate_refusals) == (2, 2)
    assert status.shadow_delay == pytest.approx(1.5, abs=0.04)
    assert status.shadow_peak == 3
    for permit in (first, second, third):
        permit.release()


def test_a_shadow_limit_records_the_peak_it_would_have_had_to_allow(
    make_semaphore: MakeSemaphore,
) -> None:
    """The most permits held at once over a shadow limit: a high-water mark, raised
    only by a grant the shadow limit alone let through (a weight counts its permits)."""
    sem = make_semaphore(2, shadow=["limit"])
    a, b = granted(sem.attempt("a")), granted(sem.attempt("b"))
    assert sem.status().shadow_peak == 0, "within the limit: no peak"
    c = granted(sem.attempt("c", weight=2))
    assert c.shadow_refused == {"limit"}
    assert sem.status().shadow_peak == 4
    for permit in (b, c):
        permit.release()
    d = granted(sem.attempt("d"))  # over by nothing: 2 held, the peak stays
    e = granted(sem.attempt("e"))  # 3 held, below the peak
    status = sem.status()
    assert (status.shadow_peak, status.shadow_limit_refusals) == (4, 2)
    assert (status.shadow_rate_refusals, status.shadow_delay) == (0, 0.0)
    for permit in (a, d, e):
        permit.release()


def test_status_shows_the_shadow_limits_the_last_task_to_ask_declared(
    make_semaphore: MakeSemaphore,
) -> None:
    """meta.shadow, the last acquirer's declaration: during a rollout from shadow to
    enforced it says which way the semaphore's tasks now go; the counts stay."""
    shadowed = make_semaphore(1, rate="10/s", shadow=["limit", "rate"])
    assert shadowed.status().shadow == frozenset(), "nobody asked yet"
    granted(shadowed.attempt("a")).release()
    assert shadowed.status().shadow == {"limit", "rate"}
    half = make_semaphore(1, name=shadowed.name, rate="10/s", shadow=["rate"])
    granted(half.attempt("b")).release()
    assert shadowed.status().shadow == {"rate"}
    enforced = make_semaphore(1, name=shadowed.name, rate="10/s")
    time.sleep(0.3)  # both grants spent the rate's slots (a shadow rate's schedule moves on)
    granted(enforced.attempt("c")).release()
    status = enforced.status()
    assert status.shadow == frozenset()
    assert status.shadow_rate_refusals >= 1, "the counts from before stay"


def test_a_shadow_rate_beside_an_enforced_limit(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, rate="2/s", shadow=["rate"])
    first = granted(sem.attempt("a"))
    refused(sem.attempt("b"))  # the limit is enforced
    first.release()
    assert granted(sem.attempt("b")).shadow_refused == {"rate"}
    sem.set_draining(True)
    refused(sem.attempt("c"))  # a drain refuses whatever is shadowed


def test_pausing_a_semaphore_without_a_rate_pauses_nothing(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2)
    sem.pause_rate(30)
    assert sem.status().rate_paused_until is None
    sem.set_rate("10/s")  # a rate set later finds no pause left behind
    granted(sem.attempt("a"))
