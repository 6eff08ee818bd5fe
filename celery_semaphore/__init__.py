"""Cluster-wide, fair, leased concurrency caps for Celery tasks, backed by Redis."""

from .aio import AsyncPermit, AsyncSemaphore
from .errors import (
    PermitLost,
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreKeyTypeError,
    SemaphoreTimeout,
)
from .protocol import HolderInfo, Place, SemaphoreStatus, WaiterInfo
from .semaphore import Permit, Semaphore

__all__ = [
    "AsyncPermit",
    "AsyncSemaphore",
    "HolderInfo",
    "Permit",
    "PermitLost",
    "Place",
    "Semaphore",
    "SemaphoreBackendError",
    "SemaphoreConnectionError",
    "SemaphoreError",
    "SemaphoreKeyTypeError",
    "SemaphoreStatus",
    "SemaphoreTimeout",
    "WaiterInfo",
]
