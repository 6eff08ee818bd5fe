"""Cluster-wide, fair, leased concurrency caps for Celery tasks, backed by Redis.

The names below are imported on first use: ``from celery_semaphore import
Semaphore`` loads only the Celery-free core (`celery_semaphore.core`),
while ``LimitedTask`` and ``install`` load the Celery side, which wires
itself into Celery when a task or app uses it.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("celery-semaphore")  # one source: pyproject.toml's version
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from .core import (
        Ask,
        AsyncPermit,
        AsyncPermitSet,
        AsyncSemaphore,
        AsyncSemaphoreSet,
        FairKeyInfo,
        Handover,
        HolderInfo,
        Parked,
        Permit,
        PermitSet,
        Place,
        Places,
        RateLimit,
        Semaphore,
        SemaphoreBackendError,
        SemaphoreConnectionError,
        SemaphoreError,
        SemaphoreKeyTypeError,
        SemaphoreSet,
        SemaphoreStatus,
        SemaphoreTimeout,
        StaleHandover,
        UnknownSemaphore,
        WaiterInfo,
        WaitingForPermit,
    )
    from .gates import per_key
    from .limits import Concurrency, Rate, RateLimited
    from .state import reset
    from .task import LimitedTask
    from .wiring import install

__all__ = [
    "Ask",
    "AsyncPermit",
    "AsyncPermitSet",
    "AsyncSemaphore",
    "AsyncSemaphoreSet",
    "Concurrency",
    "FairKeyInfo",
    "Handover",
    "HolderInfo",
    "LimitedTask",
    "Parked",
    "Permit",
    "PermitSet",
    "Place",
    "Places",
    "Rate",
    "RateLimit",
    "RateLimited",
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
    "install",
    "per_key",
    "reset",
]
_CELERY_SIDE = {
    "Concurrency": ".limits",
    "Rate": ".limits",
    "RateLimited": ".limits",
    "LimitedTask": ".task",
    "install": ".wiring",
    "per_key": ".gates",
    "reset": ".state",
}
_HOME = {name: _CELERY_SIDE.get(name, ".core") for name in __all__}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
