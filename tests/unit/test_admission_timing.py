"""When a refused task asks again, and what it carries across its waits (no Redis)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_semaphore import Place
from celery_semaphore.config import SemaphoreConfig
from celery_semaphore.formats import QUEUE_HEADER, WAIT_HEADER, WaitState
from celery_semaphore.retry import home_queue, with_waits_added
from celery_semaphore.waiting import countdown, estimate_turn, should_wait_in_place


def place(position: int, *, hold: float | None = 0.4, pace: float | None = None,
          limit: int = 4, draining: bool = False, holders: int | None = None) -> Place:  # fmt: skip
    return Place(
        1, position, limit if holders is None else holders, limit, draining, None, hold, pace
    )


def test_the_turn_follows_the_measured_pace_but_never_beyond_twice_the_capacity_pace() -> None:
    assert estimate_turn(place(8)) == pytest.approx(8 * 0.4 / 4)  # no line measured yet
    assert estimate_turn(place(8, pace=0.15)) == pytest.approx(8 * 0.15)  # slower hand-overs
    assert estimate_turn(place(8, pace=5.0)) == pytest.approx(8 * 0.2)  # capped at 2 x 0.1
    assert estimate_turn(place(8, hold=None, pace=0.3)) == pytest.approx(2.4)
    assert estimate_turn(place(8, hold=None)) is None
    assert estimate_turn(place(8, draining=True)) is None


def test_only_the_next_limit_wait_in_place_and_only_for_a_near_turn() -> None:
    assert should_wait_in_place(place(2), max_block=1.0)
    assert not should_wait_in_place(place(5), max_block=1.0)  # beyond the limit
    # One permit free and kept for the first in line (on its way): the 5th is among
    # the next limit after it (a release hands over that many), the 6th is not.
    assert should_wait_in_place(place(5, holders=3), max_block=1.0)
    assert not should_wait_in_place(place(6, holders=3), max_block=1.0)
    assert not should_wait_in_place(place(2, hold=10.0), max_block=1.0)  # turn too far
    assert should_wait_in_place(place(2, hold=None), max_block=1.0)  # no estimate: try
    assert not should_wait_in_place(place(1), max_block=0.0)
    assert not should_wait_in_place(place(1, draining=True), max_block=1.0)


def test_countdown_aims_half_a_hold_before_the_turn_within_its_bounds() -> None:
    config = SemaphoreConfig(backoff_jitter=False, backoff_max=30.0)
    assert countdown(0, place(20, hold=0.4), config) == pytest.approx((20 * 0.1 - 0.2) * 0.9)
    assert countdown(0, place(1, hold=0.4), config) == 0.02  # at least MIN_COUNTDOWN
    assert countdown(0, place(10_000, hold=0.4), config) == 30.0  # at most backoff_max
    assert countdown(3, None, config) == pytest.approx(0.5 * 2**3)  # no estimate: backoff
    assert countdown(5000, None, config) == 30.0  # 2.0 ** 5000 would overflow
    jittered = SemaphoreConfig(backoff_max=30.0)
    assert all(0.02 <= countdown(3, None, jittered) <= 4.0 for _ in range(50))


def test_the_wait_state_travels_in_a_header() -> None:
    request = SimpleNamespace(
        **{
            WAIT_HEADER: {
                "tickets": {"a": 5, "b": 0},
                "waits": 3,
                "first_ask": 1.5,
                "period_start": 1,
                "handover": ["a", 9],
            }
        }
    )
    state = WaitState.of(request)
    assert (state.tickets, state.waits, state.period_waits) == ({"a": 5}, 3, 2)
    assert state.handover == ("a", 9)
    encoded = state.encode()
    assert "handover" not in encoded  # the publisher adds it to each handed-over copy
    assert WaitState.of(SimpleNamespace(**{WAIT_HEADER: encoded})).tickets == {"a": 5}
    assert WaitState.of(SimpleNamespace()) == WaitState()


def test_a_handed_over_request_retries_to_the_queue_it_serves() -> None:
    by_handover = SimpleNamespace(
        delivery_info={"routing_key": "reports.semaphore-handover"}, **{QUEUE_HEADER: "reports"}
    )
    assert home_queue(by_handover) == "reports"
    assert home_queue(SimpleNamespace(delivery_info={"routing_key": "reports"})) is None
    assert home_queue(SimpleNamespace(delivery_info=None)) is None


def test_an_own_retry_adds_the_waits_back_and_starts_a_new_wait_period() -> None:
    request = SimpleNamespace(celery_semaphore_waits=4, headers={"x": 1})
    options = with_waits_added(request, {"retries": 2})
    assert options["retries"] == 6
    assert options["headers"]["x"] == 1
    assert options["headers"][WAIT_HEADER]["waits"] == 4
    assert options["headers"][WAIT_HEADER]["period_start"] == 4
    assert with_waits_added(SimpleNamespace(), {"retries": 2}) == {"retries": 2}
