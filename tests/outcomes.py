"""Small assertions the semaphore tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

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


def script_calls(client: Any) -> tuple[int, int]:
    """The script calls a Redis has counted since its last CONFIG RESETSTAT, as
    functions (FCALL) or scripts (EVALSHA): (calls, failed calls)."""
    stats = client.info("commandstats")
    found = [stats.get(f"cmdstat_{command}", {}) for command in ("evalsha", "fcall")]
    return sum(s.get("calls", 0) for s in found), sum(s.get("failed_calls", 0) for s in found)
