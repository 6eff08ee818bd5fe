"""Weights in the semaphore core (sync and asyncio alike), on a real Redis.

A contender may take k permits (``weight``) and k of the rate's grants
(``rate_weight``) at once: granted when all of them are free, in line order, so
a heavy waiter at the head holds back the lighter ones behind it; every release,
lease expiry and renewal moves all k together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from outcomes import granted, refused, wait_for

from celery_semaphore import RateLimit, Semaphore
from devkit.redis_servers import RedisServer

MakeSemaphore = Callable[..., Any]


def permits_in_use(sem: Any) -> int:
    return int(sem.status().holder_count)


def test_a_weight_takes_that_many_permits_and_gives_them_all_back(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(5)
    heavy = granted(sem.attempt("heavy", weight=3))
    assert heavy.weight == 3
    assert permits_in_use(sem) == 3
    (row,) = sem.status().holders
    assert (row.holder, row.permits) == ("heavy", 3), "one holder listed, with its weight"
    light = granted(sem.attempt("light", weight=2))
    refused(sem.attempt("one-more", queue=False))
    assert permits_in_use(sem) == 5
    assert heavy.release() is True
    assert heavy.release() is False, "its seats went with it, once"
    assert permits_in_use(sem) == 2
    again = granted(sem.attempt("again", weight=3))
    light.release()
    again.release()
    assert permits_in_use(sem) == 0


def test_a_heavy_waiter_at_the_head_holds_back_lighter_ones_behind_it(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(4)
    first = granted(sem.attempt("first", weight=2))
    second = granted(sem.attempt("second"))
    heavy = refused(sem.attempt("heavy", weight=3))  # 1 free, it needs 3
    light = refused(sem.attempt("light"))  # 1 free, but the heavy one is ahead (FIFO)
    assert (heavy.position, light.position) == (1, 2)
    first.release()  # 3 free: the heavy one's turn, not yet the light one's
    refused(sem.attempt("light"))
    granted(sem.attempt("heavy", weight=3))
    refused(sem.attempt("light"))  # 0 free
    second.release()
    granted(sem.attempt("light"))


def test_a_waiter_in_place_is_granted_when_its_weight_fits(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(3)
    holders = [granted(sem.attempt(f"h{i}")) for i in range(3)]
    results: dict[str, Any] = {}

    def wait(holder: str, weight: int) -> None:
        results[holder] = sem.acquire(timeout=10, holder=holder, weight=weight)

    heavy = threading.Thread(target=wait, args=("heavy", 2))
    heavy.start()
    wait_for(lambda: sem.status().waiter_count == 1, what="the heavy waiter in line")
    light = threading.Thread(target=wait, args=("light", 1))
    light.start()
    wait_for(lambda: sem.status().waiter_count == 2, what="the light waiter in line")
    holders[0].release()  # 1 free: the heavy head needs 2, the light one waits behind it
    time.sleep(0.3)
    assert results == {}, "nobody granted past the heavy head"
    holders[1].release()  # 2 free: the heavy one
    heavy.join(10)
    assert results["heavy"].weight == 2
    assert "light" not in results
    holders[2].release()
    light.join(10)
    assert set(results) == {"heavy", "light"}
    assert permits_in_use(sem) == 3


def test_a_lease_that_runs_out_frees_every_seat_and_a_renewal_keeps_them(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(3, lease_timeout=0.3)
    lapsing = granted(sem.attempt("lapsing", weight=2))
    kept = granted(sem.attempt("kept"))
    time.sleep(0.2)
    assert kept.renew(5.0)
    time.sleep(0.2)
    granted(sem.attempt("after", weight=2))  # the 2 seats of the lapsed one were reclaimed
    assert permits_in_use(sem) == 3
    assert lapsing.release() is False


def test_renewing_a_weighted_permit_extends_all_its_seats(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(4, lease_timeout=0.3)
    permit = granted(sem.attempt("held", weight=3))
    for _ in range(3):
        time.sleep(0.15)
        assert permit.renew(0.3)
    assert permits_in_use(sem) == 3, "all three seats outlived the first lease"
    assert sem.renew_many(["held"], 0.3) == set(), "by id too"
    time.sleep(0.15)
    assert permits_in_use(sem) == 3
    refused(sem.attempt("two", weight=2, queue=False))


def test_a_rate_weight_spends_that_many_grants(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate=RateLimit(10, 1.0, burst=3))
    granted(sem.attempt("batch", weight=3))  # the whole burst at once
    place = refused(sem.attempt("next", rate_weight=3))
    assert place.rate_due == pytest.approx(0.3, abs=0.03), "three intervals for three grants"
    one = refused(sem.attempt("one", queue=False))
    assert one.rate_due == pytest.approx(0.4, abs=0.03), "one interval after the three ahead"
    time.sleep(0.32)
    granted(sem.attempt("next", rate_weight=3))


def test_a_weighted_permit_given_back_unused_gives_its_grants_back(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(5, rate=RateLimit(10, 1.0, burst=2))
    unused = granted(sem.attempt("unused", weight=2))
    refused(sem.attempt("blocked", queue=False))
    assert unused.give_back_unused()
    granted(sem.attempt("after", weight=2, rate_weight=2))


def test_the_limit_and_the_rate_each_take_their_own_weight(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2, rate=RateLimit(10, 1.0, burst=4))
    granted(sem.attempt("a", weight=1, rate_weight=4))  # one permit, four grants
    place = refused(sem.attempt("b", queue=False))
    assert place.holders == 1, "a permit is free: the rate refused it"
    assert place.rate_due is not None and place.rate_due > 0


def test_weights_that_could_never_be_granted_are_errors(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2, rate=RateLimit(10, 1.0))
    with pytest.raises(ValueError, match=r"weight 3 is more than the limit 2 .*raise the limit"):
        sem.attempt("x", weight=3)
    with pytest.raises(ValueError, match=r"rate weight 2 is more than the burst 1"):
        sem.acquire(timeout=1, weight=2)
    with pytest.raises(TypeError, match=r"weight must be an int"):
        sem.try_acquire("x", weight="2")
    assert sem.status().waiter_count == 0, "nothing was asked"


def test_a_weighted_place_taken_at_publish_counts_when_it_asks(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(3)
    first = granted(sem.attempt("first", weight=2))
    sem.take_place("heavy", wait_lease=30, weight=2)
    refused(sem.attempt("light"))  # 1 free, but the heavy place ahead needs 2
    first.release()
    granted(sem.attempt("heavy", weight=2))
    granted(sem.attempt("light"))


def test_after_a_data_loss_renewals_write_weighted_permits_back_with_their_weight(
    redis_server: RedisServer,
) -> None:
    sem = Semaphore(redis_server.url, "weighted-loss", 4, pause_after_loss=0.6)
    try:
        permit = granted(sem.attempt("permit", weight=3))
        granted(sem.attempt("by-id"))
        redis_server.restart()
        place = refused(sem.attempt("late", weight=1))
        assert place.resumes_in is not None
        assert permit.renew() is True
        assert sem.renew_many(["by-id"], weight=1) == set()
        status = sem.status()
        assert status.holder_count == 4, "3 seats and 1"
        assert {h.holder: h.permits for h in status.holders} == {"permit": 3, "by-id": 1}
        time.sleep(place.resumes_in + 0.05)
        refused(sem.attempt("late"))  # the written-back permits fill the limit
        assert permit.release() is True
        granted(sem.attempt("late", weight=3))
    finally:
        sem.close()
