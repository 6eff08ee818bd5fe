"""The wait decision (`celery_semaphore.waiting.decide`): a pure function, no Redis, no Celery."""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_semaphore.config import SemaphoreConfig
from celery_semaphore.core import Place
from celery_semaphore.waiting import (
    PLACE_GRACE,
    Countdown,
    GiveUp,
    Park,
    WaitInPlace,
    binding,
    decide,
)


class Fixed:
    """A random source that always answers the middle of the range."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def place(position: int, *, hold: float | None = 0.4, limit: int = 4,
          draining: bool = False, resumes_in: float | None = None) -> Place:  # fmt: skip
    return Place(1, position, limit, limit, draining, None, hold, None, resumes_in)


HANDOVER = SemaphoreConfig()
COUNTDOWN = SemaphoreConfig(wait_mode="countdown")


def test_the_next_in_line_with_a_near_turn_waits_in_place() -> None:
    assert decide(place(2), waits=0, waited=0.0, config=HANDOVER) == WaitInPlace(1.0)
    assert decide(place(2), waits=0, waited=0.0, config=COUNTDOWN) == WaitInPlace(1.0)


@pytest.mark.parametrize("where", [place(5), place(4, hold=2.0), place(1, draining=True)], ids=str)
def test_far_back_a_slow_line_or_draining_parks_in_handover_mode(where: Place) -> None:
    assert decide(where, waits=0, waited=0.0, config=HANDOVER) == Park(due=None)


def test_once_it_waited_in_place_it_parks_with_what_is_left_of_its_budget() -> None:
    config = SemaphoreConfig(max_wait_time=10.0)
    decision = decide(place(1), waits=2, waited=4.0, config=config, may_wait_in_place=False)
    assert decision == Park(due=6.0)


def test_countdown_mode_retries_half_a_hold_before_the_turn() -> None:
    decision = decide(place(8), waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    # turn in 8 x 0.4 / 4 = 0.8 s; half a hold earlier = 0.6 s; jitter 0.9
    assert decision == Countdown(pytest.approx(0.54), None)


def test_after_a_data_loss_the_turn_comes_after_the_pause() -> None:
    paused = place(2, resumes_in=3.0)
    delay = decide(paused, waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    assert isinstance(delay, Countdown) and delay.delay == pytest.approx(3.0 * 1.05)
    short = place(1, resumes_in=0.5)  # a pause shorter than max_block: wait in place
    assert decide(short, waits=0, waited=0.0, config=COUNTDOWN) == WaitInPlace(1.0)
    unknown = Place(1, 1, 1, 1, False, None, None, None, 4.0)  # no hold measured yet
    delay = decide(unknown, waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    assert isinstance(delay, Countdown) and delay.delay >= 4.0


def test_in_handover_mode_a_turn_due_when_the_pause_ends_comes_back_then() -> None:
    """Parked, it would wait for a handover nobody makes when admissions resume."""
    paused = place(2, resumes_in=3.0)  # among the next round: refused only by the pause
    delay = decide(paused, waits=0, waited=0.0, config=HANDOVER, rng=Fixed())
    assert isinstance(delay, Countdown) and delay.delay == pytest.approx(3.0 * 1.05)
    far = place(9, resumes_in=3.0)  # past the next round: handed over as permits free
    assert decide(far, waits=0, waited=0.0, config=HANDOVER) == Park(due=None)


def test_a_message_that_cannot_park_counts_down_instead() -> None:
    decision = decide(place(8), waits=0, waited=0.0, config=HANDOVER, may_park=False, rng=Fixed())
    assert isinstance(decision, Countdown)


def test_a_countdown_longer_than_the_place_holds_refreshes_the_place() -> None:
    decision = decide(place(200), waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    assert isinstance(decision, Countdown) and decision.delay > PLACE_GRACE / 2
    assert decision.refresh_place_for == pytest.approx(decision.delay * 1.5 + PLACE_GRACE)


def test_without_a_place_it_backs_off_exponentially() -> None:
    config = SemaphoreConfig(backoff_base=0.5, backoff_max=60.0, backoff_jitter=False)
    delays = [decide(None, waits=w, waited=0.0, config=config) for w in range(4)]
    assert delays == [Countdown(0.5, None), Countdown(1.0, None), Countdown(2.0, None),
                      Countdown(4.0, None)]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "waits", "waited"),
    [(SemaphoreConfig(max_waits=3), 3, 0.0), (SemaphoreConfig(max_wait_time=5.0), 0, 5.0)],
)
def test_a_spent_budget_gives_up(config: SemaphoreConfig, waits: int, waited: float) -> None:
    assert decide(place(9), waits=waits, waited=waited, config=config) == GiveUp(waits, waited)
    assert isinstance(decide(None, waits=waits, waited=waited, config=config), GiveUp)


def test_a_budget_not_yet_spent_waits_on() -> None:
    config = SemaphoreConfig(max_waits=3, max_wait_time=5.0)
    assert decide(place(9), waits=2, waited=4.9, config=config) == Park(due=pytest.approx(0.1))


def rated(position: int, rate_due: float) -> Place:
    """A place under a rate of 20/s with no concurrency cap (limit 1,000,000)."""
    return Place(1, position, 0, 1_000_000, False, None, 0.01, 0.05, None, rate_due)


def test_under_a_rate_the_slot_decides_whether_to_wait_in_place() -> None:
    assert decide(rated(10, 0.5), waits=0, waited=0.0, config=HANDOVER) == WaitInPlace(1.0)
    paused = replace(rated(1, 0.5), rate_paused_for=0.45)
    assert decide(paused, waits=0, waited=0.0, config=HANDOVER) == Park(due=None), (
        "nobody waits in place while RateLimited pauses the rate"
    )
    assert decide(rated(40, 2.0), waits=0, waited=0.0, config=HANDOVER) == Park(due=None)


def test_a_countdown_aims_just_before_the_slot_of_a_rate() -> None:
    decision = decide(rated(40, 2.0), waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    assert isinstance(decision, Countdown)
    assert decision.delay == pytest.approx(2.0 - 0.05), "just before the slot, no jitter"


def test_the_slot_of_a_rate_is_never_later_than_the_turn() -> None:
    slow_line = Place(1, 3, 3, 3, False, None, 2.0, 0.7, None, 0.1)  # the cap binds, not the rate
    decision = decide(slow_line, waits=0, waited=0.0, config=COUNTDOWN, rng=Fixed())
    assert isinstance(decision, Countdown) and decision.delay > 0.5, "half a hold before the turn"


def test_several_gates_wait_for_the_refusing_one_whose_turn_is_farthest() -> None:
    near, far, unknown = place(1), place(8), place(3, hold=None)
    assert binding([near, far], refused_by=[0, 1]) == 1
    assert binding([far, near], refused_by=[1]) == 1, "only those that refused it count"
    assert binding([near, unknown, far], refused_by=[0, 1, 2]) == 1, "unknown is farthest"
    assert binding([far, far], refused_by=[0, 1]) == 0, "the first of equals"


def test_behind_a_shadow_limit_only_the_pause_and_the_rate_decide() -> None:
    """A place whose limit is a shadow limit (`Place.limit_binds` False) is never far
    back for it: far back in a full line it waits in place for a rate's near slot, and
    parks only for a far one."""
    far_back = replace(place(50, hold=2.0), limit_binds=False)
    assert decide(far_back, waits=0, waited=0.0, config=HANDOVER) == WaitInPlace(1.0)
    assert decide(replace(far_back, rate_due=0.3), waits=0, waited=0.0, config=HANDOVER) == (
        WaitInPlace(1.0)
    )
    assert decide(replace(far_back, rate_due=5.0), waits=0, waited=0.0, config=HANDOVER) == (
        Park(due=None)
    )
    assert decide(place(50, hold=2.0), waits=0, waited=0.0, config=HANDOVER) == Park(due=None)
