"""Cluster-wide, fair, leased concurrency caps for Celery tasks, backed by Redis."""

from . import events as _events  # noqa: F401  (connects the Celery event senders)
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
from .task import LimitedTask
from .worker import install

__all__ = [
    "AsyncPermit",
    "AsyncSemaphore",
    "HolderInfo",
    "LimitedTask",
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
    "install",
]
