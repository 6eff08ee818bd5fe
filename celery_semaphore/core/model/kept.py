"""Kept permits: a task's process keeps its permit for its next task while that costs
nobody anything (release.lua with ARG.keep_as). A method of `SemaphoreModel`; the
other half of the rule, the `Recall` a new line publishes, is in `stand_in_line` and
`places.take_place`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from celery_semaphore.core.constants import KEPT, NOT_RELEASED, RELEASED

from .replies import NOTHING, Caller

if TYPE_CHECKING:
    from .semaphore import SemaphoreModel


def keep(
    model: SemaphoreModel, caller: Caller, holder: str, now_us: int, *, token: int, kept_as: str,
    info: str,
) -> int:  # fmt: skip
    """A task ended, and its process would keep its permit for its next task of
    the same semaphore and weight (release.lua with ARG.keep_as; see "Kept
    permits" in the package docstring). Kept when it costs nobody anything: nobody
    waits, admissions are not paused, the holders are within the limit (one an
    operator lowered gets its surplus back), and the semaphore has no rate and no
    shadow limit (each start they count is counted here, by a grant). Kept, the
    holding moves to ``kept_as`` with its token, permits and lease, first held now,
    ``info`` beside it; else this is `release`. `KEPT`, `RELEASED` or `NOT_RELEASED`.

    Why: while nobody waits, a permit given back is only taken again by the next
    task; kept, that task starts without asking. A line forming takes it back
    (`stand_in_line` publishes `Recall`), so FIFO among waiters holds."""
    now_ms = now_us // 1000
    model.begin(caller.pause_ms, now_us)
    reclaimed = model.reclaim(now_ms)
    holding = model.holders.get(holder)
    keeps = (
        holding is not None
        and holding.token == token
        and kept_as not in model.holders
        and not model.waiters
        and not model.paused()
        and model.permits_held() <= model.effective_limit(caller.limit)
        and model.effective_rate(NOTHING) is None
        and not (caller.shadow or model.recorded_shadow)
    )
    if holding is not None and keeps:
        del model.holders[holder]
        model.holders[kept_as] = replace(holding, acquired_ms=now_ms, info=info)
        return KEPT
    released = model.give_back(caller, holder, now_us, token, reclaimed=reclaimed)
    return RELEASED if released else NOT_RELEASED
