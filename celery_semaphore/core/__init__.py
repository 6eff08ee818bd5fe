"""The semaphore itself, with no Celery in it: usable from any program (sync or asyncio).

- ``_async/semaphore.py``: `AsyncSemaphore`, the hand-written source;
  ``_sync/semaphore.py``: `Semaphore`, generated from it (``scripts/unasync.py``);
- ``_async/permit.py``: `AsyncPermit`; ``_async/semaphore_set.py``: `AsyncSemaphoreSet`,
  several semaphores taken in one step (all or none); each generated into ``_sync/``;
- ``_async/store.py``: the store protocol, the seam every store plugs into;
  ``stores.py``: which store a URL names; ``requests.py``: what a semaphore asks of its
  store, typed;
- ``redis/``: the Redis store and everything Redis-specific (scripts, keys, epochs, the
  parked index, connections, discovery; only this folder imports redis);
- ``memory/``: the memory store (``memory://``), the reference model behind the API;
- ``model/``: the reference model, the rules stated once;
- ``ask.py``: what a contender asks for (`Ask`: weight, priority, fair key, ...);
- ``protocol.py``: a semaphore's settings and its requests, checked;
  ``results.py``: the values replies become; ``wakeups.py``: how long a waiter sleeps;
- ``errors.py``: the exception tree; ``rates.py``: rates ("20/s");
- ``validation.py``: argument checks.

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
    Claimed,
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
    "Claimed",
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
