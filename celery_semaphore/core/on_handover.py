"""How a semaphore calls its ``on_handover``, before the call that handed over returns.

The synchronous semaphore calls it inline. The asyncio one must not block its
event loop while a plain function publishes: it awaits a coroutine function,
and runs a plain function in a thread (``asyncio.to_thread``) and awaits that.
``scripts/unasync.py`` maps the ``*_async`` names here to the plain ones.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from .results import Handover

OnHandover = Callable[[list[Handover]], Any]


def _is_coroutine_function(function: Any) -> bool:
    call = getattr(function, "__call__", None)  # noqa: B004 (an object with async __call__)
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def check_on_handover_async(on_handover: Any) -> None:
    if on_handover is not None and not callable(on_handover):
        raise TypeError(f"on_handover must be callable or None, got {on_handover!r}")


def check_on_handover(on_handover: Any) -> None:
    check_on_handover_async(on_handover)
    if _is_coroutine_function(on_handover):
        raise TypeError(
            f"on_handover must be a plain function here, got the coroutine function "
            f"{on_handover!r}: Semaphore cannot await it (AsyncSemaphore can)"
        )


async def call_on_handover_async(on_handover: OnHandover, handovers: list[Handover]) -> None:
    if _is_coroutine_function(on_handover):
        await on_handover(handovers)
        return
    returned = await asyncio.to_thread(on_handover, handovers)
    if inspect.isawaitable(returned):  # a plain callable that returns a coroutine
        await returned


def call_on_handover(on_handover: OnHandover, handovers: list[Handover]) -> None:
    on_handover(handovers)
