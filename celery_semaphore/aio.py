"""The semaphore for asyncio: the same scripts and guarantees as :mod:`.semaphore`."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import redis
import redis.asyncio

from . import protocol, validation
from .connection import AsyncClient, connect_async, translate
from .errors import SemaphoreKeyTypeError, SemaphoreTimeout
from .protocol import Place, SemaphoreStatus
from .scripts import NAMES, source


class AsyncPermit:
    """A granted permit; ``async with`` releases it on exit."""

    def __init__(
        self,
        semaphore: AsyncSemaphore,
        holder: str,
        fencing_token: int,
        expires_at: float,
        waited: float = 0.0,
    ) -> None:
        self.semaphore = semaphore
        self.holder = holder
        self.fencing_token = fencing_token
        self.expires_at = expires_at
        self.waited = waited

    async def release(self) -> bool:
        """Give the permit back; False if it was already released or lost."""
        return await self.semaphore._release(self.holder, self.fencing_token)

    async def renew(self, lease_timeout: float | None = None) -> bool:
        """Extend the lease from now; False once the permit is lost."""
        lost = await self.semaphore._renew(
            [(self.holder, self.fencing_token)], lease_timeout, [self]
        )
        return self.holder not in lost

    async def __aenter__(self) -> AsyncPermit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        return (
            f"AsyncPermit(semaphore={self.semaphore.name!r}, holder={self.holder!r}, "
            f"fencing_token={self.fencing_token})"
        )


class AsyncSemaphore:
    """:class:`celery_semaphore.Semaphore` for asyncio (``redis.asyncio`` clients)."""

    def __init__(
        self,
        redis: Any,
        name: str,
        limit: int,
        *,
        lease_timeout: float = protocol.DEFAULT_LEASE_TIMEOUT,
        namespace: str = protocol.DEFAULT_NAMESPACE,
        waiter_lease: float = protocol.DEFAULT_WAITER_LEASE,
        recheck_interval: float = protocol.DEFAULT_RECHECK_INTERVAL,
        idle_ttl: float = protocol.DEFAULT_IDLE_TTL,
    ) -> None:
        self._spec = protocol.SemaphoreSpec(
            name,
            limit,
            lease_timeout=lease_timeout,
            namespace=namespace,
            waiter_lease=waiter_lease,
            recheck_interval=recheck_interval,
            idle_ttl=idle_ttl,
        )
        self.client: AsyncClient
        self.client, self.url = connect_async(redis)
        self._owns_client = isinstance(redis, str)
        self._scripts = {n: self.client.register_script(source(n)) for n in NAMES}
        self._held: contextvars.ContextVar[tuple[AsyncPermit, ...]] = contextvars.ContextVar(
            f"celery_semaphore_held_{id(self)}", default=()
        )

    name = property(lambda self: self._spec.name)
    limit = property(lambda self: self._spec.limit)
    lease_timeout = property(lambda self: self._spec.lease_timeout)
    keys = property(lambda self: self._spec.keys)

    def __repr__(self) -> str:
        return f"AsyncSemaphore({self.url!r}, name={self.name!r}, limit={self.limit})"

    async def _call(self, script: str, args: list[Any]) -> Any:
        try:
            return await self._scripts[script](keys=self._spec.keys.script_keys, args=args)
        except redis.ResponseError as error:
            if "WRONGTYPE" in str(error):
                raise await self._wrong_type() from error
            raise translate(error, self.url) from error
        except redis.RedisError as error:
            raise translate(error, self.url) from error

    async def _wrong_type(self) -> Exception:
        for key, expected in self._spec.expected_types():
            actual = protocol.text(await self.client.type(key))
            if actual not in ("none", expected):
                return SemaphoreKeyTypeError(key, actual, expected)
        return SemaphoreKeyTypeError(self._spec.keys.meta, "unknown type", "hash")

    async def attempt(
        self,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        queue: bool = True,
        wait_lease: float | None = None,
        lease_timeout: float | None = None,
        info: str = "",
    ) -> AsyncPermit | Place:
        """See :meth:`celery_semaphore.Semaphore.attempt`."""
        holder = protocol.new_holder_id() if holder is None else holder
        args = self._spec.acquire_args(
            holder,
            ticket,
            queue=queue,
            wait_lease=wait_lease,
            lease_timeout=lease_timeout,
            info=info,
        )
        result = self._spec.parse_acquire(await self._call("acquire", args))
        if isinstance(result, Place):
            return result
        return AsyncPermit(self, holder, result.fencing_token, result.expires_at, result.waited)

    async def enqueue(self, holder: str, *, wait_lease: float | None = None, info: str = "") -> int:
        """See :meth:`celery_semaphore.Semaphore.enqueue`."""
        args = self._spec.enqueue_args(holder, wait_lease, info)
        return int(await self._call("enqueue", args))

    async def try_acquire(
        self, holder: str | None = None, ticket: int | None = None
    ) -> AsyncPermit | None:
        """A permit if one can be granted now, else None (the contender keeps its place)."""
        result = await self.attempt(holder, ticket)
        return result if isinstance(result, AsyncPermit) else None

    async def acquire(
        self,
        timeout: float | None = None,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        info: str = "",
    ) -> AsyncPermit:
        """Wait in FIFO order for a permit; :class:`SemaphoreTimeout` after ``timeout`` s.

        Cancelling the waiting coroutine drops its place in line.
        """
        holder = protocol.new_holder_id() if holder is None else holder
        started = time.monotonic()
        try:
            result = await self.wait_for_turn(timeout, holder, ticket, info=info)
        except asyncio.CancelledError:
            await asyncio.shield(self._release(holder, None))
            raise
        if isinstance(result, AsyncPermit):
            return result
        await self._release(holder, None)
        raise SemaphoreTimeout(
            self.name,
            result.limit,
            time.monotonic() - started,
            f"position {result.position} in line, {result.holders} holders",
        )

    async def wait_for_turn(
        self,
        timeout: float | None,
        holder: str,
        ticket: int | None = None,
        *,
        wait_lease: float | None = None,
        info: str = "",
    ) -> AsyncPermit | Place:
        """Like :meth:`acquire`, but on timeout return the :class:`Place`, still in line."""
        if timeout is not None:
            validation.check_seconds(timeout, "timeout", allow_zero=True)
        started = time.monotonic()
        result = await self.attempt(holder, ticket, wait_lease=wait_lease, info=info)
        if isinstance(result, AsyncPermit) or timeout == 0:
            return result
        try:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(self._spec.keys.channel)
        except redis.RedisError as error:
            raise translate(error, self.url) from error
        try:
            while True:
                ticket = result.ticket or ticket
                result = await self.attempt(holder, ticket, wait_lease=wait_lease, info=info)
                if isinstance(result, AsyncPermit):
                    return result
                remaining = None if timeout is None else timeout - (time.monotonic() - started)
                if remaining is not None and remaining <= 0:
                    return result
                try:
                    await self._sleep(pubsub, result, remaining)
                except redis.RedisError as error:
                    raise translate(error, self.url) from error
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _sleep(self, pubsub: Any, place: Place, remaining: float | None) -> None:
        """Until a wake-up that may admit ``place``, or the pause runs out."""
        deadline = time.monotonic() + self._spec.pause(place, remaining)
        while (left := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(timeout=left)
            if message is not None and self._spec.admits(message, place.ticket):
                return

    async def release(self, holder: str) -> bool:
        """Release whatever ``holder`` holds and drop its place in line (idempotent)."""
        return await self._release(holder, None)

    async def _release(self, holder: str, token: int | None) -> bool:
        released, _held_ms = await self._call("release", self._spec.release_args(holder, token))
        return bool(released)

    async def renew_many(
        self, holders: Iterable[str | AsyncPermit], lease_timeout: float | None = None
    ) -> set[str]:
        """Extend every live holder's lease in one round trip; return the lost ones."""
        items = list(holders)
        pairs = [
            (h.holder, h.fencing_token) if isinstance(h, AsyncPermit) else (h, None) for h in items
        ]
        return await self._renew(
            pairs, lease_timeout, [h for h in items if isinstance(h, AsyncPermit)]
        )

    async def _renew(
        self,
        pairs: Sequence[tuple[str, int | None]],
        lease_timeout: float | None,
        permits: Iterable[AsyncPermit] = (),
    ) -> set[str]:
        if not pairs:
            return set()
        lease_ms = self._spec.lease_ms(lease_timeout)
        expires_at, lost = self._spec.parse_renew(
            await self._call("renew", self._spec.renew_args(pairs, lease_ms))
        )
        for permit in permits:
            if permit.holder not in lost:
                permit.expires_at = expires_at
        return lost

    async def status(self) -> SemaphoreStatus:
        """Limits, live holders (with lease expiry) and live waiters in line order."""
        return self._spec.parse_status(await self._call("status", [protocol.STATUS_MOST]))

    async def set_limit(self, limit: int) -> int | None:
        """See :meth:`celery_semaphore.Semaphore.set_limit`."""
        validation.check_limit(limit)
        return await self._configure("override", str(limit))

    async def clear_limit(self) -> int | None:
        """Drop the runtime override."""
        return await self._configure("override", "")

    async def set_draining(self, draining: bool) -> bool:
        """While draining, nobody new is admitted. Returns the previous state."""
        return await self._configure("draining", "1" if draining else "") == 1

    async def _configure(self, field: str, value: str) -> int | None:
        reply = await self._call("configure", self._spec.configure_args(field, value))
        previous = protocol.text(reply)
        return int(previous) if previous else None

    async def __aenter__(self) -> AsyncPermit:
        permit = await self.acquire()
        self._held.set((*self._held.get(), permit))
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        *rest, permit = self._held.get()
        self._held.set(tuple(rest))
        await permit.release()

    async def aclose(self) -> None:
        """Close the client if this semaphore created it from a URL."""
        if self._owns_client:
            await self.client.aclose()
