"""What a task refused a permit does next: one pure decision, no Redis, no Celery.

`decide()` takes where the task stands (its `Place`, or None when Redis could
not be asked), how long and how often it has waited, and its settings, and
answers with one of:

- `WaitInPlace`: its turn is due within ``semaphore_max_block``: block for it
  (only the next ``limit`` in line after those the free permits are kept for, and
  only once per attempt);
- `Park`: leave its message beside its place; it is handed over when due
  (handover mode);
- `Countdown`: ask again after ``delay`` seconds (countdown mode, a message
  that cannot be parked, or no place known), refreshing the place first when
  it would lapse before then;
- `GiveUp`: the wait budget (``semaphore_max_waits`` / ``_max_wait_time``) is spent.

The wait mode is read from the config it is given (the task's own:
`celery_semaphore.config.task_config()`), through ``SemaphoreConfig.parks``,
the one reading of ``wait_mode`` (publishing and the worker's hand-over queues
use it too).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .config import SemaphoreConfig
from .core import Place

MIN_COUNTDOWN = 0.02
#: How long a place taken or refreshed by a waiting task holds beyond its next
#: ask (the place lapses if the task never comes back: a lost message).
PLACE_GRACE = 5.0
#: A countdown aimed at a rate's slot brings the task back this long before it.
SLOT_LEAD = 0.05


class Random(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True)
class WaitInPlace:
    seconds: float


@dataclass(frozen=True)
class Park:
    #: Hand it over after this long even if its turn has not come (its wait
    #: budget runs out then); None: only when its turn comes.
    due: float | None


@dataclass(frozen=True)
class Countdown:
    delay: float
    #: Refresh the place for this long before going (it would lapse first); None: no need.
    refresh_place_for: float | None


@dataclass(frozen=True)
class GiveUp:
    waits: int
    waited: float


Decision = WaitInPlace | Park | Countdown | GiveUp


def estimate_turn(place: Place) -> float | None:
    """Seconds until ``place`` is likely served: its position times the pace of the
    line, the time between grants measured on the server while others waited (slower
    than hold / limit when hand-overs are slow), at most twice hold / limit: when
    tasks come back late the permits idle and the measured pace slows down, which
    would send them back later still. While admissions are paused after a data
    loss, the turn comes after the pause. Under a rate, never before the slot the
    rate gives the place (``Place.rate_due``, exact)."""
    if place.draining:
        return None
    if not place.limit_binds:  # a shadow limit: only the pause and the rate's slot
        return max(place.resumes_in or 0.0, place.rate_due or 0.0)
    capacity = place.hold_estimate / max(place.limit, 1) if place.hold_estimate else None
    pace = place.grant_interval or capacity
    turn = None
    if pace is not None:
        if capacity is not None:
            pace = min(pace, 2 * capacity)
        turn = (place.resumes_in or 0.0) + place.position * pace
    if place.rate_due is not None:
        return place.rate_due if turn is None else max(turn, place.rate_due)
    return turn


def binding(places: Sequence[Place], refused_by: Sequence[int]) -> int:
    """Of a request refused on several gates at once (`Places`), the index of the
    gate it waits for: among those that refused it, the one whose turn is farthest
    (unknown counts as farthest; the first of equals). It parks there, and its wait
    is decided on that place."""

    def farthest(index: int) -> float:
        turn = estimate_turn(places[index])
        return math.inf if turn is None else turn

    return max(refused_by or range(len(places)), key=farthest)


def among_next_round(place: Place) -> bool:
    """Whether fewer waiters are ahead of ``place`` than the free permits (kept for
    tasks ahead on their way) plus one round of the limit: as far ahead as a release
    hands parked tasks over (common_after_free.lua's dispatch: free + window); any place where
    the limit is a shadow limit."""
    if not place.limit_binds:
        return True
    return place.position - 1 < max(0, place.limit - place.holders) + place.limit


def due_at_resume(place: Place) -> bool:
    """Whether ``place`` was refused only because admissions are paused after a data
    loss (its turn is due when they resume): it comes back then as a countdown
    retry, rather than park with nobody left to hand it over when the pause ends."""
    return place.resumes_in is not None and among_next_round(place)


def should_wait_in_place(place: Place, max_block: float) -> bool:
    """Only the next ``limit`` in line wait in place, after those ahead that the free
    permits are kept for (`among_next_round`), and only for a turn due soon; nobody
    while a task's `RateLimited` pauses the rate (that task comes back first when the
    pause ends, and needs a worker process then)."""
    if max_block <= 0 or place.draining or not among_next_round(place):
        return False
    if place.rate_paused_for is not None:
        return False
    if place.resumes_in is not None and place.resumes_in > max_block:
        return False
    turn = estimate_turn(place)
    return turn is None or turn <= max_block


def countdown(
    waits: int, place: Place | None, config: SemaphoreConfig, rng: Random = random
) -> float:
    """When to ask again: half a hold before the estimated turn (so the request
    arrives among the next ``limit`` and waits in place briefly), or `SLOT_LEAD`
    before the slot a rate gives it, else exponential backoff with full jitter when the
    semaphore can't estimate; never before admissions resume after a data loss."""
    turn = estimate_turn(place) if place is not None else None
    if turn is not None and place is not None and turn == place.rate_due:
        delay = turn - SLOT_LEAD  # a slot is exact and each its own: no jitter
    elif turn is not None and place is not None and place.hold_estimate is not None:
        early = turn - place.hold_estimate / 2
        delay = early * (rng.uniform(0.85, 0.95) if config.backoff_jitter else 0.9)
    else:
        cap = min(config.backoff_max, config.backoff_base * 2.0 ** min(waits, 64))
        delay = rng.uniform(0.0, cap) if config.backoff_jitter else cap
    if place is not None and place.resumes_in is not None:
        spread = rng.uniform(1.0, 1.1) if config.backoff_jitter else 1.0
        delay = max(delay, place.resumes_in * spread)
    return min(max(delay, MIN_COUNTDOWN), config.backoff_max)


def budget_left(waited: float, config: SemaphoreConfig) -> float | None:
    """Seconds until the wait budget in time (``semaphore_max_wait_time``) runs out."""
    if config.max_wait_time is None:
        return None
    return max(0.0, config.max_wait_time - waited)


def decide(
    place: Place | None,
    *,
    waits: int,
    waited: float,
    config: SemaphoreConfig,
    may_wait_in_place: bool = True,
    may_park: bool = True,
    max_block: float | None = None,
    rng: Random = random,
) -> Decision:
    """What a task refused at ``place`` does next.

    ``waits``: its waits in this wait period; ``waited``: seconds since its first
    ask in it. ``may_wait_in_place``: False once it waited in place in this
    attempt; ``may_park``: False when its message cannot be parked (too large,
    not serializable, Redis refused it) or may not be (that Redis would keep it
    less safely than the broker: `celery_semaphore.durability`). ``max_block``: the
    longest wait in place now, if not ``config.max_block``
    (`celery_semaphore.worker.pool_occupancy`).
    """
    block = config.max_block if max_block is None else max_block
    if may_wait_in_place and place is not None and should_wait_in_place(place, block):
        return WaitInPlace(block)
    over_count = config.max_waits is not None and waits >= config.max_waits
    over_time = config.max_wait_time is not None and waited >= config.max_wait_time
    if over_count or over_time:
        return GiveUp(waits, waited)
    if place is not None and may_park and config.parks and not due_at_resume(place):
        return Park(budget_left(waited, config))
    delay = countdown(waits, place, config, rng)
    refresh = delay * 1.5 + PLACE_GRACE if place is not None and delay > PLACE_GRACE / 2 else None
    return Countdown(delay, refresh)
