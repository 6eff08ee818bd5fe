"""Giving the tasks parked in the broker their places again (after a data loss, at a start).

On RabbitMQ, or a Redis broker apart from the semaphores' Redis, a parked task's
message waits in a parking queue (`celery_semaphore.parking_queues`) and its
place in line, in the semaphores' Redis, says only where. When that Redis loses
its data the messages are safe and their places are gone: nobody would hand them
over. `rebuild()` reads the parking queues listed in the broker (its namespace's
`directory()`: which queues to read does not depend on the lost data), parks
each message that has no place (with the ticket it carries, so the line keeps
its order) and hands over those now due. On RabbitMQ it takes each queue's
messages without acknowledging them and gives them back (the broker puts them
back in their order); on a Redis broker it reads the lists without taking from
them. A message whose task was already served is a stale copy: it is dropped.
A worker does it when it notices the loss (while admissions are paused) and when
it starts (a message parked while Redis failed has no place either).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from celery_semaphore.config import SemaphoreConfig, get_config
from celery_semaphore.core import Claimed, Handover, Semaphore
from celery_semaphore.formats import Gate, WaitState, encode_in_broker
from celery_semaphore.gates import semaphore_of
from celery_semaphore.parking_queues import (
    BrokerLink,
    directory,
    list_queue,
    parking_queue_entity,
)
from celery_semaphore.state import state_of

logger = logging.getLogger(__name__)

#: Messages read from one parking queue at most in one rebuild.
MOST_REBUILT = 100_000
#: The token a rebuild asks about (`Semaphore.claim()` of a message for itself: it
#: changes nothing, and says whether the message has a place).
PROBE_TOKEN = 1
#: How long the place `record_limit()` takes holds (it gives it back at once).
PROBE_LEASE = 5.0


def rebuild(app: Any, *, only_short: bool = False) -> int:
    """Give every message in the app's parking queues that has no place in line its
    place again, then hand over those now due; returns how many got a place.

    While a queue is read its messages are out of the movers' reach (their handovers
    wait for the deadline), so ``only_short`` (at a start, when nothing says Redis
    lost anything) reads only the queues of the semaphores whose parking queues hold
    more messages than their lines count parked: the mark of places lost while no
    worker of this app ran."""
    config = get_config(app)
    link = state_of(app).semaphores.broker_link
    entries = read_directory(link, config.namespace)
    if only_short:
        entries = short_of_places(app, entries, config)
    placed = 0
    for entry in entries:
        try:
            placed += rebuild_queue(app, link, entry, config)
        except Exception as error:  # one queue failing does not stop the others
            logger.warning("could not read parking queue %s: %r", entry.get("parking"), error)
    return placed


def short_of_places(
    app: Any, entries: list[dict[str, Any]], config: SemaphoreConfig
) -> list[dict[str, Any]]:
    """The entries of the semaphores whose parking queues hold more messages than their
    lines count parked or handed over (each entry's ``messages``: read with the
    directory)."""
    messages: dict[str, int] = {}
    for entry in entries:
        name = Gate.decode(entry["gate"]).name
        messages[name] = messages.get(name, 0) + entry["messages"]
    store = state_of(app).semaphores.store(config.redis_url)
    counted = {c.name: c.parked_count + c.handed_over_count for c in store.counts(
        config.namespace, [name for name, count in messages.items() if count]
    )}  # fmt: skip
    short = {name for name, count in messages.items() if count > counted.get(name, 0)}
    return [entry for entry in entries if Gate.decode(entry["gate"]).name in short]


def messages_in(link: BrokerLink, name: str) -> int | None:
    """How many messages queue ``name`` holds (ready), or None: it is gone (deleted;
    never declared again by a rebuild). Hold the link's lock."""
    channel = link.side_channel()
    try:
        _, count, _ = parking_queue_entity(name).bind(channel).queue_declare(passive=True)
    except Exception:  # 404: the broker closes the channel
        return None
    with contextlib.suppress(Exception):
        channel.close()
    return int(count)


def read_directory(link: BrokerLink, namespace: str) -> list[dict[str, Any]]:
    """The parking queues listed in ``namespace``'s `directory()` that still exist, one
    entry each, with the messages each holds (``messages``); on RabbitMQ the directory
    is written back compacted (one message per queue, none for a queue deleted
    since)."""
    entries: dict[str, dict[str, Any]] = {}
    listing = directory(namespace)
    with link.channel() as channel:
        lists = link.lists(namespace)
        if lists is not None:
            return lists.directory(listing)
        queue = parking_queue_entity(listing).bind(channel)
        queue.declare()
        taken = []
        while (message := queue.get(no_ack=False)) is not None:
            taken.append(message)
            try:
                entry = json.loads(message.body)
                entries[str(entry["parking"])] = entry
            except (ValueError, KeyError, TypeError):
                logger.warning("dropped an unreadable entry of %s: %r", listing, message.body)
        found = []
        for entry in entries.values():
            count = messages_in(link, entry["parking"])
            if count is not None:
                list_queue(channel, listing, entry)
                found.append({**entry, "messages": count})
        for message in taken:
            message.ack()
    return found


def rebuild_queue(
    app: Any, link: BrokerLink, entry: dict[str, Any], config: SemaphoreConfig
) -> int:
    """Place the messages of one parking queue that have none (see `rebuild()`)."""
    gate, parking, home = Gate.decode(entry["gate"]), entry["parking"], entry["home"]
    store = state_of(app).semaphores.store(config.redis_url)
    # What parking hands over waits until the messages are back in the broker.
    later: list[Handover] = []
    quiet = Semaphore(
        store, gate.name, gate.limit, lease_timeout=config.lease_timeout,
        namespace=config.namespace, family=gate.family, rate=gate.rate, shadow=gate.shadow,
        on_handover=later.extend, handover_window=config.handover_window,
        handover_deadline=config.handover_deadline,
    )  # fmt: skip
    payload = encode_in_broker(parking, home)
    with link.channel():
        lists = link.lists(config.namespace)
        placed = (
            rebuild_amqp_queue(link, quiet, parking, payload=payload, gate=gate, config=config)
            if lists is None
            else sum(
                place_again(quiet, headers, drop, payload=payload, gate=gate, config=config)
                for headers, drop in lists.messages(parking)
            )
        )
    if placed:
        record_limit(quiet)
        semaphore = semaphore_of(app, gate, config)
        if later and semaphore.on_handover is not None:
            semaphore.on_handover(later)
        semaphore.dispatch()
    return placed


def place_again(
    quiet: Semaphore,
    headers: dict[str, Any],
    drop: Callable[[], None],
    *,
    payload: str,
    gate: Gate,
    config: SemaphoreConfig,
) -> int:
    """Park the message with ``headers`` again if it has no place (1), drop it if its
    task was served already (``drop``), else leave it (0)."""
    holder = headers.get("id")
    if not holder:
        return 0
    answer = quiet.claim(holder, Handover(holder, PROBE_TOKEN, payload))
    if answer is Claimed.STALE:
        drop()
    elif answer is Claimed.ABSENT:
        park_again(quiet, headers, payload, gate, config)
        return 1
    return 0


def rebuild_amqp_queue(
    link: BrokerLink, quiet: Semaphore, parking: str, *, payload: str, gate: Gate,
    config: SemaphoreConfig,
) -> int:  # fmt: skip
    """Place the messages of RabbitMQ parking queue ``parking``: taken on a channel of
    their own, given back in their order when it closes."""
    placed = 0
    with link.lock:
        channel = link.side_channel()
        try:
            queue = parking_queue_entity(parking).bind(channel)
            for _ in range(MOST_REBUILT):
                message = queue.get(no_ack=False)
                if message is None:
                    break
                headers = message.headers or {}
                placed += place_again(
                    quiet, headers, message.ack, payload=payload, gate=gate, config=config
                )
        finally:
            channel.close()  # the broker puts back what was not acknowledged, in order
    return placed


def record_limit(semaphore: Semaphore) -> None:
    """Record ``semaphore``'s declared limit in its line (lost with the data, and what
    a handover counts free permits by; a task's ask records it, parking does not): a
    place taken and given back at once, which hands over the parked tasks now due."""
    probe = f"celery-semaphore-rebuild-{uuid.uuid4().hex}"
    semaphore.take_place(probe, wait_lease=PROBE_LEASE)
    semaphore.release(probe)


def park_again(
    semaphore: Semaphore, headers: dict[str, Any], payload: str, gate: Gate,
    config: SemaphoreConfig,
) -> None:  # fmt: skip
    """Park the task of the message with ``headers`` with the ticket it carries and
    what is left of its wait budget."""
    state = WaitState.in_headers(headers)
    due = None
    if config.max_wait_time is not None:
        waited = time.time() - (state.first_ask or time.time())
        due = max(0.0, config.max_wait_time - waited)
    ticket = state.tickets.get(gate.name)
    info = str(headers.get("task", ""))
    semaphore.park(headers["id"], payload, ticket, info=info, due=due, ask=gate.ask)
