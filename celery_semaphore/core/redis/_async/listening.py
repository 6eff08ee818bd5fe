"""A waiter's pub/sub connection: subscribing, keeping it between waits, reconnecting.

A waiter in place listens on its semaphore's wake channel (`celery_semaphore.core.wakeups`
says what the messages mean). The connection is kept between waits of the same
process (`celery_semaphore.core.redis.listeners`); a waiter that loses Redis reconnects
with a growing pause, unless Redis refused its login.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis

from celery_semaphore.core.errors import SemaphoreConnectionError
from celery_semaphore.core.redis.connection import AsyncClient, is_cluster, translate
from celery_semaphore.core.redis.listeners import LISTENERS

RECONNECT_FIRST = 0.05  # seconds before a waiter first asks again after losing Redis
RECONNECT_MOST = 1.0
#: How long a wait reads a kept pub/sub connection for the confirmation of the
#: UNSUBSCRIBE the last wait sent (`listen`) before it makes a new one.
UNSUBSCRIBE_TIMEOUT = 0.5
#: How long `confirm` waits for Redis to answer the PING after a SUBSCRIBE.
CONFIRM_TIMEOUT = 0.5


def reconnectable(error: SemaphoreConnectionError) -> bool:
    """Whether Redis may come back by itself (restart, failover): not a refused login."""
    return not isinstance(error.__cause__, redis.AuthenticationError)


async def listen(client: AsyncClient, url: str, channels: Sequence[str]) -> Any:
    """A pub/sub object subscribed to ``channels``: one an earlier wait of this process
    left (`core.listeners`), once Redis has confirmed its UNSUBSCRIBE, else a new one."""
    pubsub = LISTENERS.take(client)
    if pubsub is not None:
        try:
            deadline = time.monotonic() + UNSUBSCRIBE_TIMEOUT
            while pubsub.subscribed and (left := deadline - time.monotonic()) > 0:
                await pubsub.get_message(timeout=left)  # stale until the confirmation
            if not pubsub.subscribed:
                await pubsub.subscribe(*channels)
                await confirm(client, pubsub)
                return pubsub
        except redis.RedisError:  # its connection broke while it idled
            pass
        await close_quietly(pubsub)
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
    try:
        await pubsub.subscribe(*channels)
        await confirm(client, pubsub)
    except redis.RedisError as error:
        await close_quietly(pubsub)
        raise translate(error, url) from error
    return pubsub


async def confirm(client: AsyncClient, pubsub: Any) -> None:
    """Return once Redis has run the SUBSCRIBE just sent on ``pubsub`` (it answers a
    PING sent after it), or after `CONFIRM_TIMEOUT`. Without this, a waiter's in-place
    attempt, on another connection, may reach Redis first, and a grant in place
    published between the two is never heard: the waiter learns of it only at its next
    recheck, seconds later. What comes before the answer is dropped: the caller asks
    after it listens, and that reads the state anyway. An ACL user that may not PING
    (the rules the plugin needs do not include it) goes unconfirmed, as before."""
    if is_cluster(client):  # a cluster's pub/sub connects per node: not confirmed
        return
    try:
        await pubsub.ping()
        deadline = time.monotonic() + CONFIRM_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(timeout=left)
            if message is not None and message.get("type") == "pong":
                return
    except redis.ResponseError:  # NOPERM: still subscribed, only not confirmed
        return


async def unlisten(client: AsyncClient, pubsub: Any, *, keep: bool) -> None:
    """The wait is over. With ``keep`` (it ended normally, so the connection is between
    replies): send UNSUBSCRIBE and leave ``pubsub`` for the next wait, which reads the
    confirmation (no round trip between a grant and the task); else close it."""
    if pubsub is None:
        return
    if keep and not is_cluster(client):  # a cluster's pub/sub holds its client
        with contextlib.suppress(redis.RedisError):
            await pubsub.unsubscribe()
            if LISTENERS.give(client, pubsub):
                return
    await close_quietly(pubsub)


async def close_quietly(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
