"""Small assertions the semaphore tests share."""

from __future__ import annotations

import time
from collections.abc import Callable

from celery_semaphore import Permit, Place


def granted(result: Permit | Place) -> Permit:
    """The permit (a sync, asyncio or test-wrapped one), asserting it is one."""
    assert result is not None and not isinstance(result, Place), (
        f"expected a permit, got {result!r}"
    )
    return result


def refused(result: Permit | Place) -> Place:
    assert isinstance(result, Place), f"expected a refusal, got {result!r}"
    return result


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.005)
