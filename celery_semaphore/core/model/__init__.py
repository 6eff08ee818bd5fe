"""The reference model: what a semaphore does, stated once, in Python.

A pure, in-memory, single-process model of one semaphore (and of several taken at once:
joint.py), written to be read as the specification of the Lua scripts in
``celery_semaphore/core/redis/lua/`` (each rule is one named function or method whose
docstring gives the rule, its reason, and the Lua it mirrors). Time is an argument of
every operation (``now_us``, the store's clock), never read by the model.
``tests/conformance`` drives this model and a real store with the same operations and
compares every reply; ``tests/unit/test_model.py`` tests each rule.

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
  draining; ``claim`` (claim.lua: a message taken from a parking queue given the turn
  handed over to another waiter, by a swap);
- waiting in place and what follows freed capacity (after_free.py: after_free(), as
  every call that frees capacity runs it): the ``w`` mark of a waiter blocked in
  ``wait_for_turn`` (mark_in_place(), unmark_in_place()), grant_in_place() (a release
  grants the waiters in place at the head of the line their permits directly), the
  wake messages a call publishes (a grant in place, or the highest ticket now
  admissible: wake(), `published`), then the handovers;
- data loss (epochs.py, lua/common_epoch.lua): the epoch of the data and the one the
  process knows, begin() (a first use, a loss, a loss noticed late, a reader), the
  pause after a loss (nothing granted, handed over or woken), holders written back
  by renewals while paused (token 0 when renewed by id; ``restored``; such a holder
  dropped when it asks itself, released by any token), ``learn_epoch``,
  ``note_lost``; `SemaphoreModel.lose_data` is the loss;
- several semaphores at once (joint.py, acquire_all.lua): all or none, one ticket in
  every line, the refusal's places, held back or leaving the lines that would admit;
- kept permits (`SemaphoreModel.keep`, release.lua with ARG.keep_as): a task's process
  keeps the permit for its next task, as a holder of its own, only while nobody waits,
  admissions run, the holders are within the limit and there is no rate and no shadow
  limit; the first waiter of an empty line publishes `Recall` (stand_in_line(),
  take_place), so the processes give kept permits back;
- ``status()``: every field above, as status.lua reads it (live entries only).

The clock enters the handover window through the average hold time (meta.hold_ms):
the model computes it exactly from the times it is given, but a store measures holds
on its own clock, so two runs agree on the window only while holds are shorter than
``max_block`` (the handover window), as they are in the conformance suite.

NOT covered (yet):

- the blocking clients (``wait_for_turn``, ``acquire``, ``SemaphoreSet.acquire``):
  their attempts and the messages they read are, not their loops and sleeps;
- several Redis Cluster slots (one epoch hash per slot); the model has one Redis;
- idle expiry of the keys, the batch bounds of one call (1,000 reclaimed, listed,
  looked at), the metrics counters and histograms, the pace estimate
  ``grant_interval``, ``hold_estimate`` as a reply field, ``family``, counts.lua.
"""

from celery_semaphore.core.constants import FAIR_TURN, PRIORITY_STEP

from .epochs import EpochHash, Epochs
from .joint import Part, acquire_all
from .order import PLAIN_ASKED, Asked, FairKey, seq_after
from .parking import Dispatch, Handover, ParkIfFar, Record, State
from .rate import Rate, Room
from .replies import (
    Caller,
    Claimed,
    Enqueued,
    FairKeyRow,
    Granted,
    GrantedInPlace,
    HolderRow,
    ParkedPlace,
    Published,
    Recall,
    Refused,
    RefusedAll,
    Stale,
    StaleCopy,
    Status,
    WaiterRow,
    WakeUp,
)
from .semaphore import Holding, SemaphoreModel, Waiting

__all__ = [
    "FAIR_TURN",
    "PLAIN_ASKED",
    "PRIORITY_STEP",
    "Asked",
    "Caller",
    "Claimed",
    "Dispatch",
    "Enqueued",
    "EpochHash",
    "Epochs",
    "FairKey",
    "FairKeyRow",
    "Granted",
    "GrantedInPlace",
    "Handover",
    "HolderRow",
    "Holding",
    "ParkIfFar",
    "ParkedPlace",
    "Part",
    "Published",
    "Rate",
    "Recall",
    "Record",
    "Refused",
    "RefusedAll",
    "Room",
    "SemaphoreModel",
    "Stale",
    "StaleCopy",
    "State",
    "Status",
    "WaiterRow",
    "Waiting",
    "WakeUp",
    "acquire_all",
    "seq_after",
]
