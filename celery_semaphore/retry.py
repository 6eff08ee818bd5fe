"""A refused task's wait, as Celery sees it: a retry that keeps the task's place in line.

`celery_semaphore.waiting` decides what a refused task does; this module
carries it out in Celery's terms:

- park (handover mode): on RabbitMQ or a Redis broker the retry's message is
  published to its parking queue (`celery_semaphore.parking_queues`) and its place in
  line says where; elsewhere it is left beside the place in line, where the
  semaphores' store keeps it at least as safely as the broker
  (`celery_semaphore.durability`), and the execution ends as a ``Retry`` that
  publishes nothing;
- countdown: the retry is published with a countdown aimed at the turn;
- give up: `SemaphoreTimeout`.

Waits are counted in ``request.retries`` (so Flower shows them) but not
against the task's own ``max_retries``: while the body runs,
``request.retries`` is the task's own count (``WAITS_MARK`` holds the waits),
and retries the body publishes add the waits back (`with_waits_added()`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from celery.exceptions import Retry

try:  # Celery 5.5+
    from celery.utils.quorum_queues import detect_quorum_queues
except ImportError:  # no native delayed delivery before
    detect_quorum_queues = None

from . import parking_queues, signals
from .config import SemaphoreConfig
from .core import Place, SemaphoreError, SemaphoreTimeout, WaitingForPermit
from .durability import Where
from .formats import (
    GATES_HEADER,
    QUEUE_HEADER,
    WAIT_HEADER,
    Gate,
    WaitState,
    base_queue,
    encode_in_broker,
    encode_signature,
    handover_queue,
    is_handover_queue,
    parking_queue,
)
from .gates import semaphore_of
from .state import state_of
from .waiting import Decision, GiveUp, Park, WaitInPlace, decide, estimate_turn
from .worker import pool_occupancy

logger = logging.getLogger(__name__)

WAITS_MARK = "celery_semaphore_waits"  # request attribute: the waits, while the body runs
#: Headers RabbitMQ adds to a dead-lettered message (a countdown sent through its delay
#: queues, Celery 5.5+): a retry that carried them on would be taken for a dead-letter
#: cycle by its next countdown and kept in a delay queue for good (Celery's own retry
#: drops them too).
DEAD_LETTER_HEADERS = frozenset({
    "x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
    "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason",
})  # fmt: skip


class Waits:
    """The waits of one execution of a task: deciding and carrying out the next one."""

    def __init__(
        self, task: Any, request: Any, state: WaitState, config: SemaphoreConfig, info: str
    ) -> None:
        self.task = task
        self.request = request
        self.state = state
        self.config = config
        self.info = info
        if state.first_ask is None:
            state.first_ask = time.time()

    @property
    def waited(self) -> float:
        return time.time() - (self.state.first_ask or time.time())

    def decide(
        self,
        place: Place | None,
        *,
        may_wait_in_place: bool = True,
        may_park: bool = True,
        max_block: float | None = None,
    ) -> Decision:
        """The next wait; it parks only where its message is at least as safe as in
        the broker (`celery_semaphore.durability`)."""
        if may_park and place is not None and self.config.parks:
            may_park = self._where() is not None
        return decide(
            place,
            waits=self.state.period_waits,
            waited=self.waited,
            config=self.config,
            may_wait_in_place=may_wait_in_place,
            may_park=may_park,
            max_block=max_block,
        )

    def _where(self) -> Where | None:
        app, config = self.task.app, self.config
        state = state_of(app)
        where = state.parking.where(app, config, state.semaphores.store(config.redis_url))
        if where is Where.BROKER and not getattr(self.request, QUEUE_HEADER, None):
            return None  # no home queue known: nowhere to hand it over to
        return where

    def in_place_for(self, place: Place) -> float | None:
        """Seconds to wait in place at ``place``, or None: not in place (a turn not due
        within ``max_block``; for a task that would park, within a shorter time while
        every other process of its worker runs a task:
        `celery_semaphore.worker.pool_occupancy`. A task that would retry with a
        countdown keeps the whole ``max_block``: its countdown aims half a hold before
        its turn, and a shorter wait would send it round the broker again and again)."""
        max_block = self.config.max_block
        short = pool_occupancy.max_block(max_block)
        if short < max_block and self._would_park(place):
            max_block = short
        decision = self.decide(place, may_park=False, max_block=max_block)
        return decision.seconds if isinstance(decision, WaitInPlace) else None

    def _would_park(self, place: Place) -> bool:
        return isinstance(self.decide(place, may_wait_in_place=False), Park)

    def park(self, gate: Gate, place: Place, due: float | None) -> Retry | None:
        """Leave the retry's message beside the place in line; the ``Retry`` (that
        publishes nothing) to end the execution with, or None when the message
        cannot be parked (the caller then retries with a countdown)."""
        self.state.waits += 1
        queue = getattr(self.request, QUEUE_HEADER, None)
        if queue and self._where() is Where.BROKER:
            return self._park_in_broker(gate, place, due, queue)
        signature = self._signature(queue=handover_queue(queue) if queue else None)
        try:
            payload = encode_signature(self.task.app, signature, self.config.park_max_bytes)
            parked = semaphore_of(self.task.app, gate, self.config).park(
                self.request.id, payload, place.ticket, info=self.info, due=due, ask=gate.ask
            )
        except (ValueError, TypeError, SemaphoreError) as error:
            self.state.waits -= 1
            logger.info(
                "%s[%s] is not parked (retried with a countdown): %s",
                self.task.name,
                self.request.id,
                error,
            )
            return None
        self._send_waiting(gate, parked.position, None)
        reason = self._reason(gate, parked.position, place)
        return Retry(str(reason), reason)

    def _park_in_broker(
        self, gate: Gate, place: Place, due: float | None, home: str
    ) -> Retry | None:
        """Park the place, saying where the message waits, then publish the retry's
        message to that parking queue; its handover, if the line moved meanwhile, is
        published once the message is there. None: not parked (a countdown then)."""
        app, task_id = self.task.app, self.request.id
        link = state_of(app).semaphores.broker_link
        parking = parking_queue(home, gate, asked=True)
        semaphore = semaphore_of(app, gate, self.config)
        signature = self._signature(queue=parking_queues.parking_queue_entity(parking))
        if not link.declare(parking, home, gate, self.config.namespace):
            self.state.waits -= 1
            return None  # said once by the link: a countdown
        with parking_queues.parking(task_id) as deferred:
            try:
                parked = semaphore.park(
                    task_id, encode_in_broker(parking, home), place.ticket, info=self.info,
                    due=due, ask=gate.ask,
                )  # fmt: skip
                signature.apply_async()
            except Exception as error:  # the broker or Redis: wait with a countdown
                self.state.waits -= 1
                logger.warning(
                    "%s[%s] is not parked in queue %s (retried with a countdown): %r",
                    self.task.name, task_id, parking, error,
                )  # fmt: skip
                return None
        for hand_over in deferred:  # its own, now that its message is in its parking queue
            hand_over()
        self._send_waiting(gate, parked.position, None)
        reason = self._reason(gate, parked.position, place)
        return Retry(str(reason), reason)

    def countdown(self, gate: Gate, place: Place | None, delay: float) -> Retry:
        """Publish the retry with a countdown of ``delay`` s (as Celery can send it:
        `native_countdown()`); the ``Retry`` to end with."""
        delay = native_countdown(self.task.app, delay)
        position = place.position if place else 0
        self._send_waiting(gate, position, delay)
        self.state.waits += 1
        signature = self._signature(countdown=delay)
        signature.apply_async()
        reason = self._reason(gate, position, place)
        return Retry(str(reason), reason, when=delay, sig=signature)

    def give_up(self, gate: Gate, place: Place | None, decision: GiveUp) -> SemaphoreTimeout:
        return SemaphoreTimeout(
            gate.name,
            place.limit if place else gate.limit,
            decision.waited,
            f"task {self.task.name}[{self.request.id}] gave up after {decision.waits} "
            "waits (semaphore_max_waits / semaphore_max_wait_time)",
        )

    def _signature(self, queue: Any = None, **options: Any) -> Any:
        """The message that brings this request back, with its wait state, to its
        queue (its consumed queue's, when it came by a handover queue) or ``queue`` (a
        name, or a kombu Queue)."""
        request = self.request
        headers = {**(request.headers or {}), WAIT_HEADER: self.state.encode()}
        for name in (GATES_HEADER, *DEAD_LETTER_HEADERS):
            headers.pop(name, None)
        return self.task.signature_from_request(
            request, None, None, queue or home_queue(request), retries=request.retries + 1,
            headers=headers, **options,
        )  # fmt: skip

    def _reason(self, gate: Gate, position: int, place: Place | None) -> WaitingForPermit:
        """What Flower, the ``task-retried`` event and the result backend show."""
        why = ""
        if place is not None and place.rate_paused_for is not None:
            why = "paused"
        elif place is not None and place.rate_due and estimate_turn(place) == place.rate_due:
            why = "rate"
        return WaitingForPermit(gate.name, position, self.state.waits, why)

    def _send_waiting(self, gate: Gate, position: int, countdown: float | None) -> None:
        signals.permit_waiting.send(
            sender=self.task,
            semaphore=gate.name,
            task_id=self.request.id,
            task_name=self.task.name,
            position=position,
            countdown=countdown,
        )


def native_countdown(app: Any, delay: float) -> float:
    """``delay`` as Celery can send it. On RabbitMQ, an app with a quorum queue (Celery
    5.5+) sends a countdown through the broker's delay queues (native delayed delivery)
    in whole seconds: it drops the fraction, and refuses a countdown under a second
    ("countdown must be a positive number": the task failed). There it is rounded up
    to whole seconds, at least one."""
    if detect_quorum_queues is None:
        return delay
    driver = state_of(app).parking.broker_driver(app)  # read once per app
    if not detect_quorum_queues(app, driver)[0]:
        return delay
    return float(max(1, math.ceil(delay)))


def home_queue(request: Any) -> str | None:
    """For a request delivered by a handover queue, the queue it serves (where its
    retries go); None for any other (Celery then routes as it was delivered)."""
    routing_key = (getattr(request, "delivery_info", None) or {}).get("routing_key")
    if is_handover_queue(routing_key):
        queue = getattr(request, QUEUE_HEADER, None)
        return queue if isinstance(queue, str) else base_queue(routing_key)
    return None


def with_waits_added(request: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Options of a retry published from inside the body: the waits are counted back
    in ``retries``, and the retry is a new contender (as Celery's retry goes to the
    back of the queue): it drops the tickets of the places it was served from, so it
    lines up behind the tasks that queued meanwhile, and its wait budget starts again."""
    waits = getattr(request, WAITS_MARK, None) if request is not None else None
    if waits is None or "retries" not in options:
        return options
    headers = dict(options.get("headers") or getattr(request, "headers", None) or {})
    headers[WAIT_HEADER] = WaitState(waits=waits, period_start=waits).encode()
    headers.pop(GATES_HEADER, None)
    return {**options, "retries": options["retries"] + waits, "headers": headers}
