"""Places in line taken when a limited task is published, so FIFO follows submission order.

Without this, a task's place in line would date from its first attempt in a
worker, and tasks submitted together would be ordered by which worker process
happened to pick them first. The place holds for a few seconds; a task that
reaches a worker later still presents its ticket and regains its place.

Where a line has room to spare, new tasks skip the place and carry their publish
time as their ticket instead (`celery_semaphore.room_at_publish`).

Publishing never stalls on the semaphore's Redis: the call gives up within
`celery_semaphore.state.QUICK_TIMEOUT`, and after a failure no places are taken for a
few seconds (tasks then take their place at their first attempt, as a task
with an ETA always does).

In handover mode a `LimitedTask` publishes through a
`ParkingProducer`: a new task whose place is far back in line is parked
there and then (where that is safe: `celery_semaphore.durability`), instead of
being sent to a worker that would only park it::

    apply_async -> take_place -> position 3, 4 free  -> published (runs at once)
    apply_async -> take_place -> position 900        -> park: parked beside its place
    apply_async -> take_place_or_park (the line parked last time: one script call)
                              -> position 901        -> parked beside its place
    ... a permit frees -> the releasing process publishes it to its queue's handover queue
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from kombu.entity import Queue
from kombu.utils import json as kombu_json

from . import parking_queues
from .config import SemaphoreConfig, get_config, task_config
from .core import Place, Semaphore
from .core.errors import SemaphoreError
from .core.protocol import rate_window
from .durability import Where
from .formats import (
    PARK_MARK,
    WAIT_HEADER,
    Gate,
    WaitState,
    encode_in_broker,
    encode_message,
    has_wait_state,
    in_broker_around_ticket,
    parking_queue,
)
from .gates import queue_of, request_gates, semaphore_of, warn_disagreeing_limits
from .state import AppState, installed_apps, state_of
from .waiting import among_next_round

logger = logging.getLogger(__name__)

PLACE_AT_PUBLISH = 5.0
PAUSE_AFTER_ERROR = 5.0

# The semaphores (lines) whose last task published here was parked: the next one takes
# its place and parks in one call (ParkingProducer). Weak: Semaphores drops old ones.
parking_lines: weakref.WeakSet[Semaphore] = weakref.WeakSet()
# Stands for the ticket in a payload encoded before the ticket is known (around_ticket()).
TICKET_MARK = "\x00celery_semaphore: ticket\x00"

# The places the publish in progress in this thread took (app, task id, gates), until
# after_task_publish confirms it: a publish that raises gives them back (drop_unsent).
_unsent = threading.local()


def published_queue(app: Any, declare: Any, exchange: Any, routing_key: str | None) -> str | None:
    """The queue a message sent to ``exchange`` with ``routing_key`` lands in, resolved
    as the worker resolves it (``declare`` is not the answer: with an explicit exchange
    and routing key Celery still declares the task's routed queue)."""
    queues = [q for q in declare or () if isinstance(q, Queue)]
    return queue_of([*queues, *app.amqp.queues.values()], exchange, routing_key)


def take_places(
    sender: Any = None,
    *,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    exchange: Any = None,
    routing_key: Any = None,
    declare: Any = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish`` handler: a place in line per gate of a new task."""
    if not headers or not is_new(headers) or headers.get(PARK_MARK):
        return
    if not isinstance(body, tuple | list) or len(body) < 2:
        return
    for app in list(installed_apps):
        # Every app of the process that knows the task name (Celery shares tasks
        # between apps) is asked in turn: the first whose settings give the task
        # gates takes its places.
        task = app.tasks.get(sender)
        if task is None:
            continue
        queue = published_queue(app, declare, exchange, routing_key)
        priority = (properties or {}).get("priority")
        if places_of(app, task, body, headers, queue, priority=priority) or WAIT_HEADER in headers:
            return  # places taken, or none needed (room_at_publish)


def is_new(headers: dict[str, Any]) -> bool:
    """Whether a message is a task's first (not a retry, not a handover, no ETA)."""
    return not (headers.get("eta") or headers.get("retries") or has_wait_state(headers))


def places_of(
    app: Any,
    task: Any,
    body: Any,
    headers: dict[str, Any],
    queue: str | None,
    *,
    priority: Any = None,
) -> dict[Gate, Place]:
    """Places in line for a new message of ``task`` to ``queue`` with ``priority`` (as
    the broker gives it), one per gate (none while publishing is paused, or if Redis
    fails); their tickets go in ``headers``."""
    warn_disagreeing_limits(app)
    state = state_of(app)
    if time.monotonic() < state.publish_paused_until:
        return {}
    config = get_config(app)
    try:
        gates = request_gates(task, body[0], body[1], queue, priority)
        if len(gates) == 1 and skips_place(app, state, config, gates[0], headers):
            return {}
        places = {
            gate: semaphore_of(app, gate, config, quick=True).take_place(
                headers["id"],
                wait_lease=PLACE_AT_PUBLISH,
                info=task.name,
                ask=gate.ask,
            )
            for gate in gates
        }
    except (TypeError, ValueError):
        return {}  # a bad key function fails the task in the worker, with a clear message
    except SemaphoreError as error:
        state.publish_paused_until = time.monotonic() + PAUSE_AFTER_ERROR
        logger.warning("no place in line taken at publish: %s", error)
        return {}
    if len(places) == 1:
        ((gate, place),) = places.items()
        state.room_at_publish.saw(gate, place)
    if places:
        tickets = {gate.name: place.ticket for gate, place in places.items()}
        headers[WAIT_HEADER] = WaitState(tickets).encode()
        _unsent.places = (app, headers["id"], list(places))
    return places


def skips_place(
    app: Any, state: AppState, config: SemaphoreConfig, gate: Gate, headers: dict[str, Any]
) -> bool:
    """Whether a new task of ``gate`` goes without a place (its line had room to spare
    when this process last looked: `celery_semaphore.room_at_publish`); it then
    carries its publish time as its ticket. Looks (reads the counts) if due."""
    room = state.room_at_publish
    ticket = room.skip(gate)
    if ticket is None and room.needs_look(gate):
        store = state.semaphores.store(config.redis_url, quick=True)
        found = store.counts(config.namespace, [gate.name])
        room.looked(gate, found[0] if found else None)
        ticket = room.skip(gate)
    if ticket is None:
        return False
    headers[WAIT_HEADER] = WaitState({gate.name: ticket}, unplaced=True).encode()
    return True


def lone_gate(app: Any, task: Any, body: Any, queue: str | None, priority: Any) -> Gate | None:
    """The one gate of a new message of ``task``, or None (none, several, or a key
    function that fails: `places_of()` deals with those)."""
    try:
        gates = request_gates(task, body[0], body[1], queue, priority)
    except (TypeError, ValueError):
        return None
    return gates[0] if len(gates) == 1 else None


def confirm_sent(sender: Any = None, **_: Any) -> None:
    """``after_task_publish`` handler: the places taken for this message stay."""
    _unsent.places = None


def drop_unsent() -> None:
    """After a publish that raised (broker down): give back the places it took, so
    no task that was never sent is counted in line or as sent (see status()).
    Best effort: if Redis fails too, the places lapse and the records age out."""
    taken = getattr(_unsent, "places", None)
    _unsent.places = None
    if taken is None:
        return
    app, task_id, gates = taken
    config = get_config(app)
    for gate in gates:
        try:
            semaphore_of(app, gate, config, quick=True).release(task_id)
        except SemaphoreError as error:
            logger.info("places of unsent task %s not given back: %s", task_id, error)


def window_of(gate: Gate, config: Any) -> float:
    """How far ahead (seconds) a place at ``gate`` counts as near (`turn_is_near()`)."""
    window: float = config.handover_window
    return window if gate.rate is None else rate_window(gate.rate, window)


def around_ticket(payload: str) -> tuple[str, str] | None:
    """``payload``, encoded with `TICKET_MARK` for a ticket, as the text before and
    after that ticket (None if the mark is not there exactly once)."""
    parts = payload.split(kombu_json.dumps(TICKET_MARK))  # type: ignore[no-untyped-call]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def turn_is_near(place: Place, rate_window: float) -> bool:
    """Whether a new task at ``place`` may be served soon after it reaches a worker:
    fewer waiters ahead of it than free permits plus one more round of the limit,
    and, under a rate, a slot within ``rate_window`` (how far ahead the scripts hand
    parked tasks over: `celery_semaphore.core.protocol.rate_window`)."""
    if place.draining or (place.rate_due is not None and place.rate_due > rate_window):
        return False
    return among_next_round(place)


class ParkingProducer:
    """The producer of a `LimitedTask`'s ``apply_async``
    in handover mode: it publishes a new task whose turn is near, and parks one
    whose place in line is far back.

    A parked message stays beside its place in line, in the semaphores' store (or
    in a parking queue of the broker: `celery_semaphore.durability`), until its turn
    comes; the process that frees a permit then publishes it to
    the queue's handover queue (`celery_semaphore.parked_tasks`). Without this, each task of a
    long backlog would reach a worker only to be refused and parked there, and
    the next owners of freed permits would wait behind that flood. Everything
    but ``publish`` is the wrapped producer's.
    """

    def __init__(self, producer: Any, task: Any) -> None:
        self._producer = producer
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(self, body: Any, **options: Any) -> Any:
        headers = options.get("headers")
        if not (isinstance(headers, dict) and headers.pop(PARK_MARK, None)):
            return self._producer.publish(body, **options)
        with parking_queues.parking(headers.get("id")) as deferred:
            sent = None if self._park(body, options) else self._producer.publish(body, **options)
        for hand_over in deferred:  # its own, now that its message is where it parked
            hand_over()
        return sent

    def _park(self, body: Any, options: dict[str, Any]) -> bool:
        """Take the message's places; park it if its turn is far. False: publish it
        (where ``options`` say: to its parking queue if it parks in the broker).

        While the line's last publish here parked (`parking_lines`), one script call
        takes the place and parks the message if its turn is far; else the place is
        taken alone, and the message parked by a second call only if its turn is far
        (so a line whose turns are near pays nothing for parking)."""
        app, task, headers = self._task.app, self._task, options["headers"]
        queue = published_queue(
            app, options.get("declare"), options.get("exchange"), options.get("routing_key")
        )
        priority = options.get("priority")
        config = task_config(task)
        gate = lone_gate(app, task, body, queue, priority) if parking_lines else None
        if gate is not None:
            semaphore = semaphore_of(app, gate, config, quick=True)
            if semaphore in parking_lines:
                parked = self._park_in_one_call(body, options, queue, gate, semaphore)
                if parked is not None:
                    return parked
        places = places_of(app, task, body, headers, queue, priority=priority)
        if len(places) != 1:
            return False  # no gate, or a queue cap and a task cap: each waits at a worker
        ((gate, place),) = places.items()
        near = turn_is_near(place, window_of(gate, config))
        where = None if near else self._where(config, queue, gate)
        if where is None:
            return False  # published as it is: its turn is near, or it may not park
        semaphore = semaphore_of(app, gate, config, quick=True)
        sent_state = headers[WAIT_HEADER]
        parked_state = WaitState.in_headers(headers)
        parked_state.first_ask = time.time()  # its wait budget starts now
        headers[WAIT_HEADER] = parked_state.encode()
        in_broker = parking_queue(queue, gate) if where is Where.BROKER and queue else None
        try:
            if in_broker is not None and queue is not None:
                payload = encode_in_broker(in_broker, queue)
            else:
                payload = encode_message(app, body, options, queue, config.park_max_bytes)
            semaphore.park(
                headers["id"], payload, place.ticket, info=task.name, due=config.max_wait_time
            )
        except (TypeError, ValueError, SemaphoreError) as error:
            headers[WAIT_HEADER] = sent_state
            logger.info("%s[%s] is not parked at publish: %s", task.name, headers["id"], error)
            return False
        parking_lines.add(semaphore)
        if in_broker is not None:
            to_parking_queue(options, in_broker)
            return False  # published, to its parking queue
        return True

    def _where(self, config: SemaphoreConfig, queue: str | None, gate: Gate) -> Where | None:
        """Where a message of this task to ``queue`` parks (its parking queue is
        declared first), or None: it may not park."""
        app = self._task.app
        state = state_of(app)
        where = state.parking.where(
            app, config, state.semaphores.store(config.redis_url, quick=True)
        )
        if where is not Where.BROKER:
            return where
        if queue is None:
            return None
        link = state.semaphores.broker_link
        return (
            where
            if link.declare(parking_queue(queue, gate), queue, gate, config.namespace)
            else None
        )

    def _park_in_one_call(
        self,
        body: Any,
        options: dict[str, Any],
        queue: str | None,
        gate: Gate,
        semaphore: Semaphore,
    ) -> bool | None:
        """Take the place at ``gate`` and park the message there if its turn is far,
        in one script call (`Semaphore.take_place_or_park()`): as `places_of()` and
        then ``park()`` would. None: do it the usual way (publishing places is paused,
        parking is not allowed here, the message cannot be parked)."""
        app, task, headers = self._task.app, self._task, options["headers"]
        warn_disagreeing_limits(app)
        state, config = state_of(app), task_config(self._task)
        if time.monotonic() < state.publish_paused_until:
            return None
        where = self._where(config, queue, gate)
        if where is None:
            return None
        first_ask = time.time()  # its wait budget starts now, if it parks
        marked = WaitState(first_ask=first_ask).encode()
        headers[WAIT_HEADER] = {**marked, "tickets": {gate.name: TICKET_MARK}}
        try:
            if where is Where.BROKER and queue is not None:
                payload: tuple[str, str] | None = in_broker_around_ticket(
                    parking_queue(queue, gate), queue
                )
            else:
                payload = around_ticket(
                    encode_message(app, body, options, queue, config.park_max_bytes)
                )
            if payload is None:
                raise ValueError("the message holds the ticket's mark")
            place, parked = semaphore.take_place_or_park(
                headers["id"],
                payload,
                window=window_of(gate, config),
                wait_lease=PLACE_AT_PUBLISH,
                info=task.name,
                due=config.max_wait_time,
                ask=gate.ask,
            )
        except (TypeError, ValueError):
            del headers[WAIT_HEADER]
            return None  # places_of() and park() say what is wrong, or publish it
        except SemaphoreError as error:
            del headers[WAIT_HEADER]
            # Perhaps taken, perhaps parked: published without a ticket, the task takes
            # its place at its first attempt; a copy parked meanwhile is then dropped
            # (acquire.lua: it asks in person).
            state.publish_paused_until = time.monotonic() + PAUSE_AFTER_ERROR
            logger.warning("no place in line taken at publish: %s", error)
            return False
        state.room_at_publish.saw(gate, place)
        headers[WAIT_HEADER] = WaitState(
            {gate.name: place.ticket}, first_ask=first_ask if parked else None
        ).encode()
        _unsent.places = (app, headers["id"], [gate])
        if not parked:
            parking_lines.discard(semaphore)
        elif where is Where.BROKER and queue is not None:
            to_parking_queue(options, parking_queue(queue, gate))
            return False
        return parked


def to_parking_queue(options: dict[str, Any], parking: str) -> None:
    """Send a message that would be published with ``options`` to parking queue
    ``parking`` instead."""
    options["exchange"], options["routing_key"] = "", parking
    options["declare"] = [
        *(options.get("declare") or ()),
        parking_queues.parking_queue_entity(parking),
    ]
