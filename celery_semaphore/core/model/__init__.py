"""The reference model: what one semaphore does, stated once, in Python.

A pure, in-memory, single-process model of ONE semaphore, written to be read as the
specification of the Lua scripts in ``celery_semaphore/core/redis/lua/`` (each rule is one
named function or method whose docstring gives the rule, its reason, and the Lua it
mirrors). Time is an argument of every operation (``now_us``, the store's clock), never
read by the model. ``tests/conformance`` drives this model and a real store with the
same operations and compares every reply; ``tests/unit/test_model.py`` tests each rule.

Covered (exactly, for the same clock readings the scripts take):

- tickets and fencing tokens, ``max(last + 1, now µs)`` (`order.seq_after`);
- the line: FIFO grant under the effective limit (override, else the caller's declared
  limit, else the recorded one), a place kept by asking again within the waiter lease,
  a ticket presented again (the earlier of it and the place held), position in line;
- holder leases and the reclaim of run-out holders and waiters at the next call;
  release (idempotent, by fencing token or by holder id, which also leaves the line),
  renew (compare-and-extend, never resurrects), a live holder asking again (a new
  token, nothing else changes);
- the runtime limit override (set, clear), draining;
- weights (k permits, j grants; head-of-line blocking: those behind a heavy waiter wait);
- priority (a ticket moved ``priority x PRIORITY_STEP``) and fair share (start-time
  fair queuing: tails, urgent tail, tie, head, fair weights; per-key waiting and grant
  counts as status shows them);
- rates (GCRA: room, slot, the half-interval grace of ``rate_tat``, burst, override,
  ``pause_rate``, a permit given back unused), shadow limits (a concurrency or rate
  limit that only counts: the counts, the peak, the lateness);
- ``take_place`` (enqueue.lua), with or without parking the place at once when its
  turn is far, and the ``sent`` count of places taken at publish whose holder has not
  asked yet;
- parking and handover (park.lua, dispatch.lua, dispatch() and the parked records of
  lua/common_parked.lua: states p, h, d, x): a payload handed over when its turn is
  near (the free permits, the window, a release since it parked), at its slot under a
  rate, at its due time, or again after its deadline with a new token; stale copies;
  a waiter served in person; revoked waiters dropped; nothing handed over while
  draining; every call that frees capacity hands over what is due (after_free());
- ``status()``: every field above, as status.lua reads it (live entries only).

The clock enters the handover window through the average hold time (meta.hold_ms):
the model computes it exactly from the times it is given, but a store measures holds
on its own clock, so two runs agree on the window only while holds are shorter than
``max_block`` (the handover window), as they are in the conformance suite.

NOT covered (yet):

- waiting in place (the ``w`` mark, grant_in_place(): a release granting a blocked
  waiter its permit directly) and the wake-up messages (PUBLISH): ``wait_for_turn``
  and ``acquire`` are not modelled beyond their attempts;
- data loss (epochs, the pause after a loss, holders restored by renew with token 0);
- several semaphores at once (acquire_all.lua);
- idle expiry of the keys, the batch bounds of one call (1,000 reclaimed, listed,
  looked at), the metrics counters and histograms, the pace estimate
  ``grant_interval``, ``hold_estimate`` as a reply field, ``family``, counts.lua.
"""

from celery_semaphore.core.constants import FAIR_TURN, PRIORITY_STEP

from .order import PLAIN_ASKED, Asked, FairKey, seq_after
from .parking import Dispatch, Handover, ParkIfFar, Record, State
from .rate import Rate, Room
from .replies import (
    Caller,
    Enqueued,
    FairKeyRow,
    Granted,
    HolderRow,
    ParkedPlace,
    Refused,
    Stale,
    Status,
    WaiterRow,
)
from .semaphore import Holding, SemaphoreModel, Waiting

__all__ = [
    "FAIR_TURN",
    "PLAIN_ASKED",
    "PRIORITY_STEP",
    "Asked",
    "Caller",
    "Dispatch",
    "Enqueued",
    "FairKey",
    "FairKeyRow",
    "Granted",
    "Handover",
    "HolderRow",
    "Holding",
    "ParkIfFar",
    "ParkedPlace",
    "Rate",
    "Record",
    "Refused",
    "Room",
    "SemaphoreModel",
    "Stale",
    "State",
    "Status",
    "WaiterRow",
    "Waiting",
    "seq_after",
]
