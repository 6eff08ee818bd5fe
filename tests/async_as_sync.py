"""The asyncio semaphore behind the synchronous API, so one test body runs against both.

``BlockingSemaphore`` runs an :class:`~celery_semaphore.AsyncSemaphore` on an event
loop in a thread of its own and waits for each call, so tests written against
:class:`~celery_semaphore.Semaphore` (threads that block in ``acquire()`` included)
drive the asyncio code unchanged. ``client`` is a synchronous client of the same
server, for the tests that inspect keys.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar

from celery_semaphore import (
    AsyncPermit,
    AsyncPermitSet,
    AsyncSemaphore,
    AsyncSemaphoreSet,
    Place,
    Places,
)
from celery_semaphore.core.redis.connection import connect

T = TypeVar("T")


class EventLoopThread:
    """One event loop, run forever in a daemon thread until :meth:`close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The coroutine's result. An exception that interrupts the wait here (a signal
        handler's) cancels the coroutine, as it would interrupt a blocking call."""
        finished = threading.Event()

        async def watched() -> T:
            try:
                return await coroutine
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(watched(), self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                finished.wait(5)
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class BlockingPermit:
    def __init__(self, loop: EventLoopThread, semaphore: BlockingSemaphore, permit: AsyncPermit):
        self._loop, self.semaphore, self.permit = loop, semaphore, permit

    holder = property(lambda self: self.permit.holder)
    fencing_token = property(lambda self: self.permit.fencing_token)
    expires_at = property(lambda self: self.permit.expires_at)
    waited = property(lambda self: self.permit.waited)
    shadow_refused = property(lambda self: self.permit.shadow_refused)
    shadow_wait = property(lambda self: self.permit.shadow_wait)
    weight = property(lambda self: self.permit.weight)
    rate_weight = property(lambda self: self.permit.rate_weight)

    def release(self) -> bool:
        return self._loop.run(self.permit.release())

    def give_back_unused(self) -> bool:
        return self._loop.run(self.permit.give_back_unused())

    def renew(self, lease_timeout: float | None = None) -> bool:
        return self._loop.run(self.permit.renew(lease_timeout))

    def __enter__(self) -> BlockingPermit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Blocking{self.permit!r}"


class BlockingSemaphore:
    def __init__(self, loop: EventLoopThread, url: str, *args: Any, **kwargs: Any) -> None:
        self._loop = loop

        async def make() -> AsyncSemaphore:
            return AsyncSemaphore(url, *args, **kwargs)

        self.async_semaphore = loop.run(make())
        self.client, _ = connect(url)  # for the test's own reads: any URL form
        self._held: list[BlockingPermit] = []

    name = property(lambda self: self.async_semaphore.name)
    limit = property(lambda self: self.async_semaphore.limit)
    lease_timeout = property(lambda self: self.async_semaphore.lease_timeout)
    keys = property(lambda self: self.async_semaphore.keys)
    url = property(lambda self: self.async_semaphore.url)

    def _wrap(self, result: Any) -> Any:
        if isinstance(result, AsyncPermit):
            return BlockingPermit(self._loop, self, result)
        return result

    def attempt(self, *args: Any, **kwargs: Any) -> BlockingPermit | Place:
        return self._wrap(self._loop.run(self.async_semaphore.attempt(*args, **kwargs)))

    def try_acquire(self, *args: Any, **kwargs: Any) -> BlockingPermit | None:
        return self._wrap(self._loop.run(self.async_semaphore.try_acquire(*args, **kwargs)))

    def acquire(self, *args: Any, **kwargs: Any) -> BlockingPermit:
        return self._wrap(self._loop.run(self.async_semaphore.acquire(*args, **kwargs)))

    def wait_for_turn(self, *args: Any, **kwargs: Any) -> BlockingPermit | Place:
        return self._wrap(self._loop.run(self.async_semaphore.wait_for_turn(*args, **kwargs)))

    def renew_many(self, holders: Iterable[Any], lease_timeout: float | None = None) -> set[str]:
        unwrapped = [h.permit if isinstance(h, BlockingPermit) else h for h in holders]
        return self._loop.run(self.async_semaphore.renew_many(unwrapped, lease_timeout))

    def __getattr__(self, name: str) -> Any:
        """take_place, release, status, set_limit, set_draining, ...: awaited as they are."""
        method = getattr(self.async_semaphore, name)
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))

    def __enter__(self) -> BlockingPermit:
        permit = self.acquire()
        self._held.append(permit)
        return permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held.pop().release()

    def close(self) -> None:
        self._loop.run(self.async_semaphore.aclose())
        self.client.close()


class BlockingPermitSet:
    def __init__(self, loop: EventLoopThread, semaphores: Any, permits: AsyncPermitSet) -> None:
        self._loop, self.permit_set = loop, permits
        self.permits = tuple(
            BlockingPermit(loop, sem, permit)
            for sem, permit in zip(semaphores, permits, strict=True)
        )

    holder = property(lambda self: self.permit_set.holder)

    def __getitem__(self, name: str) -> BlockingPermit:
        for permit in self.permits:
            if permit.semaphore.name == name:
                return permit
        raise KeyError(name)

    def __iter__(self) -> Any:
        return iter(self.permits)

    def __len__(self) -> int:
        return len(self.permits)

    def release(self) -> bool:
        return self._loop.run(self.permit_set.release())

    def give_back_unused(self) -> bool:
        return self._loop.run(self.permit_set.give_back_unused())

    def renew(self, lease_timeout: float | None = None) -> bool:
        return self._loop.run(self.permit_set.renew(lease_timeout))

    def __enter__(self) -> BlockingPermitSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BlockingSemaphoreSet:
    """An :class:`~celery_semaphore.AsyncSemaphoreSet` of ``BlockingSemaphore``s."""

    def __init__(self, loop: EventLoopThread, semaphores: Iterable[BlockingSemaphore]) -> None:
        self._loop = loop
        self.semaphores = tuple(semaphores)

        async def make() -> AsyncSemaphoreSet:
            return AsyncSemaphoreSet([sem.async_semaphore for sem in self.semaphores])

        self.async_set = loop.run(make())

    def _wrap(self, result: Any) -> Any:
        if isinstance(result, AsyncPermitSet):
            return BlockingPermitSet(self._loop, self.semaphores, result)
        return result

    def attempt(self, *args: Any, **kwargs: Any) -> BlockingPermitSet | Places:
        return self._wrap(self._loop.run(self.async_set.attempt(*args, **kwargs)))

    def try_acquire(self, *args: Any, **kwargs: Any) -> BlockingPermitSet | None:
        return self._wrap(self._loop.run(self.async_set.try_acquire(*args, **kwargs)))

    def acquire(self, *args: Any, **kwargs: Any) -> BlockingPermitSet:
        return self._wrap(self._loop.run(self.async_set.acquire(*args, **kwargs)))

    def wait_for_turn(self, *args: Any, **kwargs: Any) -> BlockingPermitSet | Places:
        return self._wrap(self._loop.run(self.async_set.wait_for_turn(*args, **kwargs)))

    def release(self, holder: str) -> bool:
        return self._loop.run(self.async_set.release(holder))
