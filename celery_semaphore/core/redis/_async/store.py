"""The Redis store: each request one script call, shared by every client of one Redis.

What is here and nowhere else: the epoch argument every call carries and the retry
when the epoch changed (`celery_semaphore.core.redis.epochs`), the scripts
(`celery_semaphore.core.redis.scripts`: Functions or EVALSHA), the wake channel
(`listening.py`), a key of the wrong type named, and the parked index. The
arguments and replies are in `celery_semaphore.core.redis.arguments`.

``core/redis/_async/store.py`` is the source; ``core/redis/_sync/store.py`` is
generated from it (``scripts/unasync.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from celery_semaphore.core.errors import (
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreKeyTypeError,
)
from celery_semaphore.core.protocol import SemaphoreSpec
from celery_semaphore.core.redis import arguments, epochs, parked_index, wake_messages
from celery_semaphore.core.redis._async.listening import listen, reconnectable, unlisten
from celery_semaphore.core.redis.connection import AsyncClient, connect_async, is_cluster, translate
from celery_semaphore.core.redis.joint import joint_problem
from celery_semaphore.core.redis.keys import ROLE_TYPES, SemaphoreKeys, call_keys_of, keys_of
from celery_semaphore.core.redis.operations import AsyncRedisOperations
from celery_semaphore.core.redis.replies import text
from celery_semaphore.core.redis.scripts import on_demand, registered
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import (
    Claimed,
    Grant,
    Handover,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
)


class AsyncRedisStore(AsyncRedisOperations):
    """Semaphores in one Redis (`celery_semaphore.core._async.store.AsyncStore`).

    ``redis``: a URL or a ready client of the matching kind; a client made from a URL
    is closed by `aclose()`, one passed in is the caller's unless ``owns_client``.
    ``url``: what a client passed in was made from (for messages). The synchronous
    store also has an operators' side (`celery_semaphore.core.redis.operations`)."""

    def __init__(
        self,
        redis: str | redis.asyncio.Redis | redis.asyncio.RedisCluster,
        url: str = "",
        *,
        owns_client: bool = False,
    ) -> None:
        self.client: AsyncClient
        self.client, self.url = connect_async(redis, url)
        self.cluster = is_cluster(self.client)
        self._owns_client = owns_client or isinstance(redis, str)
        self._scripts = registered(self.client)

    def __repr__(self) -> str:
        return f"AsyncRedisStore({self.url!r})"

    def keys_of(self, spec: SemaphoreSpec) -> SemaphoreKeys:
        """The Redis keys of the semaphore ``spec`` describes (on a Cluster, its epoch
        hash is its slot's)."""
        return keys_of(spec.namespace, spec.name, self.cluster)

    async def _call(
        self,
        script: str,
        args: list[Any],
        specs: Sequence[SemaphoreSpec],
        *,
        reader: bool = False,
    ) -> Any:
        """Run ``script`` on the keys of ``specs`` (several: acquire_all, sharing the
        first one's epoch hash); a script that answers with another epoch than this
        process knows (a data loss, or the first call) is run again with that one. A
        ``reader`` (status) neither learns an epoch nor starts a pause (common_epoch.lua)."""
        first = specs[0]
        epoch_key = keys_of(first.namespace, first.name, self.cluster).epoch
        pause = 0.0 if reader else first.pause_after_loss
        call_keys: Sequence[str] = call_keys_of(first.namespace, first.name, self.cluster)
        if len(specs) > 1:
            call_keys = [key for spec in specs for key in self.keys_of(spec).call_keys]
        for _ in range(3):
            epoch = epochs.argument(self.url, epoch_key, pause)
            args.append(epoch)
            reply = await self._run(script, call_keys, args, specs)
            if not epochs.is_epoch_reply(reply):
                return reply
            args.pop()
            epochs.learn(self.url, epoch_key, reply)
        raise SemaphoreError(f"Redis at {self.url} changed its data epoch three times in one call")

    async def _run(
        self,
        script: str,
        call_keys: Sequence[str],
        args: list[Any],
        specs: Sequence[SemaphoreSpec],
    ) -> Any:
        try:
            return await self._scripts[script](keys=call_keys, args=args, client=self.client)
        except redis.ResponseError as error:
            if "WRONGTYPE" in str(error):
                raise await self._wrong_type(specs) from error
            raise translate(error, self.url) from error
        except redis.RedisError as error:
            raise translate(error, self.url) from error

    async def _wrong_type(self, specs: Sequence[SemaphoreSpec]) -> Exception:
        for spec in specs:
            expected_types = zip(self.keys_of(spec).call_keys, (*ROLE_TYPES, "hash"), strict=True)
            for key, expected in expected_types:
                actual = text(await self.client.type(key))
                if actual not in ("none", expected):
                    return SemaphoreKeyTypeError(key, actual, expected)
        return SemaphoreKeyTypeError(self.keys_of(specs[0]).meta, "unknown type", "hash")

    async def acquire(
        self, spec: SemaphoreSpec, request: Acquire
    ) -> tuple[Grant | Place, list[Handover]]:
        reply = await self._call("acquire", arguments.acquire_args(spec, request), (spec,))
        return arguments.parse_acquire(spec.name, reply)

    async def acquire_all(
        self, specs: Sequence[SemaphoreSpec], request: AcquireAll
    ) -> tuple[list[Grant] | Places, list[list[Handover]]]:
        on_demand(self.client, "acquire_all")
        reply = await self._call("acquire_all", arguments.joint_acquire_args(specs, request), specs)
        return arguments.parse_joint_acquire(specs, reply)

    def joint_problem(self, members: Sequence[tuple[Any, SemaphoreSpec]]) -> str | None:
        return joint_problem(
            [(getattr(store, "client", store), store.url, spec) for store, spec in members],
            cluster=self.cluster,
        )

    async def park(self, spec: SemaphoreSpec, request: Park) -> tuple[Parked, list[Handover]]:
        return arguments.parse_park(
            await self._call("park", arguments.park_args(spec, request), (spec,))
        )

    async def claim(self, spec: SemaphoreSpec, request: Claim) -> Claimed:
        reply = await self._call("claim", arguments.claim_args(spec, request), (spec,))
        return arguments.parse_claim(reply)

    async def list_parked(self, spec: SemaphoreSpec) -> None:
        """List the semaphore in its namespace's parked index, at most every
        ``parked_index.REGISTER_EVERY`` s per client in this process."""
        namespace, listings = spec.namespace, parked_index.listings(self.client)
        if not listings.due(namespace, spec.name):
            return
        started = parked_index.clock()
        register = self._scripts["parked_index/register"]
        try:
            await register(
                keys=[parked_index.index_key(namespace)],
                args=list(arguments.RegisterArgs(name=spec.name)),
                client=self.client,
            )
        except redis.RedisError as error:
            raise translate(error, self.url) from error
        listings.done(namespace, spec.name, started)

    async def enqueue(
        self, spec: SemaphoreSpec, request: Enqueue
    ) -> tuple[Place, bool, list[Handover]]:
        reply = await self._call("enqueue", arguments.enqueue_args(spec, request), (spec,))
        return arguments.parse_enqueue(reply, far=request.far is not None)

    async def dispatch(self, spec: SemaphoreSpec, drop: tuple[str, ...]) -> list[Handover]:
        reply = await self._call("dispatch", arguments.dispatch_args(spec, drop), (spec,))
        return arguments.parse_dispatch(reply)

    async def release(self, spec: SemaphoreSpec, request: Release) -> tuple[int, list[Handover]]:
        reply = await self._call("release", arguments.release_args(spec, request), (spec,))
        return arguments.parse_release(reply)

    async def renew(
        self, spec: SemaphoreSpec, request: Renew
    ) -> tuple[float, set[str], list[Handover], int]:
        reply = await self._call("renew", arguments.renew_args(spec, request), (spec,))
        return arguments.parse_renew(reply)

    async def configure(
        self, spec: SemaphoreSpec, request: Configure
    ) -> tuple[str | None, list[Handover]]:
        reply = await self._call("configure", arguments.configure_args(spec, request), (spec,))
        return arguments.parse_configure(reply)

    async def status(self, spec: SemaphoreSpec) -> SemaphoreStatus:
        reply = await self._call("status", arguments.status_args(spec), (spec,), reader=True)
        return arguments.parse_status(spec.name, reply)

    async def learn_epoch(self, spec: SemaphoreSpec) -> None:
        await self._call("epoch", [], (spec,))

    async def note_lost(self, spec: SemaphoreSpec, count: int) -> None:
        try:
            await self.client.hincrby(self.keys_of(spec).meta, "m_lost", count)
        except redis.RedisError as error:
            raise translate(error, self.url) from error

    async def listen(self, specs: Sequence[SemaphoreSpec]) -> Any:
        return await listen(self.client, self.url, [self.keys_of(spec).channel for spec in specs])

    async def wait_for_wakeup(
        self, subscription: Any, ticket: int, holder: str, seconds: float
    ) -> Grant | None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = await subscription.get_message(timeout=left)
            except redis.RedisError as error:
                raise translate(error, self.url) from error
            if message is None:
                continue
            grant = wake_messages.grant_in(message, holder)
            if grant is not None or wake_messages.admits(message, ticket):
                return grant
        return None

    async def wait_for_message(self, subscription: Any, seconds: float) -> str | None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = await subscription.get_message(timeout=left)
            except redis.RedisError as error:
                raise translate(error, self.url) from error
            if message is not None and message.get("type") in {"message", "pmessage"}:
                return text(message["channel"])
        return None

    def wake_channel(self, spec: SemaphoreSpec) -> str:
        return self.keys_of(spec).channel

    async def unlisten(self, subscription: Any, *, keep: bool) -> None:
        await unlisten(self.client, subscription, keep=keep)

    def reconnectable(self, error: SemaphoreConnectionError) -> bool:
        return reconnectable(error)

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()
