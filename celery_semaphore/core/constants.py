"""Numbers the scripts and the Python side share, stated once.

`celery_semaphore.core.redis.scripts` writes them into the Lua prelude (`lua_prelude()`),
so none of them is copied by hand into a ``.lua`` file; the metrics, the reference
model (`celery_semaphore.core.model`) and the tests import them from here.
"""

from __future__ import annotations

#: Upper bounds of the wait and hold histograms, ms; a last bucket takes the rest
#: (metrics.py exports them in seconds, as Prometheus' ``le`` labels).
HISTOGRAM_BOUNDS_MS = (5, 25, 100, 250, 1000, 2500, 10000, 30000, 60000, 300000, 1800000)
#: How far one level of priority moves a new ticket ahead, µs: 2^40, about 12.7 days,
#: so a more urgent waiter goes ahead of every less urgent one ("The order of the line").
PRIORITY_STEP = 2**40
#: How far a fair key's tail moves on for one turn of weight 1, µs (2^20): a key of
#: weight w moves on FAIR_TURN / w.
FAIR_TURN = 2**20


HISTOGRAMS = ("wait", "hold")

#: The holder ids of permits kept by a pool process between its tasks start so:
#: ``kept|<worker>|<pid>[.<thread>]|<weight>|<semaphore>`` (`celery_semaphore.kept_permits`);
#: the counts a scrape reads tell them apart by it (counts.lua, the model's status).
KEPT_PREFIX = "kept|"


def histogram_fields(kind: str) -> list[str]:
    """The ``meta`` fields of histogram ``kind``'s buckets (not cumulative: one per
    bound, then the rest), in order."""
    return [f"m_{kind}_b{index}" for index in range(len(HISTOGRAM_BOUNDS_MS) + 1)]


def lua_prelude() -> str:
    """The constants as Lua ``local`` definitions, first in every script's prelude."""
    bounds = ", ".join(str(bound) for bound in HISTOGRAM_BOUNDS_MS)
    tables = []
    for kind in HISTOGRAMS:
        first, *rest = (f"'{name}'" for name in histogram_fields(kind))
        tables.append(f"  {kind} = {{[0] = {first}, {', '.join(rest)}, sum = 'm_{kind}_sum'}},")
    return "\n".join([
        "-- Generated from celery_semaphore/core/constants.py by scripts.py: edit them there.",
        f"local BUCKETS = {{{bounds}}}",
        "local HISTOGRAMS = {", *tables, "}",
        f"local PRIORITY_STEP = {PRIORITY_STEP}",
        f"local FAIR_TURN = {FAIR_TURN}",
        f"local KEPT_PREFIX = '{KEPT_PREFIX}'",
    ])  # fmt: skip


#: What a store's release did (its reply's first field): nothing (already released
#: or lost), released, or kept for the holder's process (`SemaphoreModel.keep`).
NOT_RELEASED, RELEASED, KEPT = 0, 1, 2

#: What a store's ``wait_for_message`` answers when it cannot tell which wake channel
#: a message came on (the memory store; PostgreSQL behind a pooler that cannot LISTEN).
ANY_CHANNEL = "*"
