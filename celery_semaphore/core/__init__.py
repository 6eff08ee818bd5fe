"""The semaphore itself, with no Celery in it: usable from any program (sync or asyncio).

- ``_async/semaphore.py``: `AsyncSemaphore`, the hand-written source;
  ``_sync/semaphore.py``: `Semaphore`, generated from it (``scripts/unasync.py``);
- ``_async/permit.py``: `AsyncPermit`; ``_async/listening.py``: a waiter's pub/sub
  connection (each generated into ``_sync/`` likewise);
- ``_async/semaphore_set.py``: `AsyncSemaphoreSet`, several semaphores taken in one
  step (all or none); ``_sync/semaphore_set.py``: `SemaphoreSet`, generated likewise;
- ``lua/``: the scripts that run in Redis, ``scripts.py`` loads them;
- ``ask.py``: what a contender asks for (`Ask`: weight, priority, fair key, ...);
- ``protocol.py``: a semaphore's settings and its scripts' arguments;
  ``replies.py``: replies read into ``results.py``'s values; ``wakeups.py``: sleeping
  until a wake-up; ``joint.py``: several semaphores in one step;
- ``keys.py``: key names and hash tags;
- ``connection.py``: URLs and clients; ``errors.py``: the exception tree;
- ``listeners.py``: pub/sub connections kept between waits in place;
- ``rates.py``: rates ("20/s") and their scripts' form;
- ``validation.py``: argument checks; ``discovery.py``: listing semaphores (operators).

Nothing here imports Celery or click (a test in ``tests/unit`` keeps it so).
"""

from ._async.permit import AsyncPermit
from ._async.semaphore import AsyncSemaphore
from ._async.semaphore_set import AsyncPermitSet, AsyncSemaphoreSet
from ._sync.permit import Permit
from ._sync.semaphore import Semaphore
from ._sync.semaphore_set import PermitSet, SemaphoreSet
from .ask import Ask
from .errors import (
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreKeyTypeError,
    SemaphoreTimeout,
    StaleHandover,
    UnknownSemaphore,
    WaitingForPermit,
)
from .rates import RateLimit
from .results import (
    FairKeyInfo,
    Handover,
    HolderInfo,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
    WaiterInfo,
)

__all__ = [
    "Ask",
    "AsyncPermit",
    "AsyncPermitSet",
    "AsyncSemaphore",
    "AsyncSemaphoreSet",
    "FairKeyInfo",
    "Handover",
    "HolderInfo",
    "Parked",
    "Permit",
    "PermitSet",
    "Place",
    "Places",
    "RateLimit",
    "Semaphore",
    "SemaphoreBackendError",
    "SemaphoreConnectionError",
    "SemaphoreError",
    "SemaphoreKeyTypeError",
    "SemaphoreSet",
    "SemaphoreStatus",
    "SemaphoreTimeout",
    "StaleHandover",
    "UnknownSemaphore",
    "WaiterInfo",
    "WaitingForPermit",
]
