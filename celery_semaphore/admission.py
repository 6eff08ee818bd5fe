"""Admission in the process that runs the task body.

Before the body runs, the request takes a permit of each of its gates (queue
cap, then task semaphore). If one is refused it gives back what it took (it
never holds one permit while waiting for another). A request among the next
``limit`` in line whose turn is due within ``semaphore_max_block`` waits for
it in place (so a freed permit never idles while its next owner sleeps); any
other is retried later with its tickets in the message headers, keeping its
place in line, and comes back about half a hold before its turn::

    attempt -> refused, position 12, limit 4, holds ~0.2 s -> turn in ~0.6 s
            -> retry(countdown ~0.5 s), headers carry {tickets, waits, first_ask}
    attempt -> refused, position 2 -> turn in ~0.1 s -> wait in place (pub/sub)
            -> granted -> body runs -> released in ``finally``

Waits are counted in ``request.retries`` (so Flower shows them) but not against
the task's own ``max_retries``: while the body runs, ``request.retries`` is
the task's own count, and retries it publishes add the waits back.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from celery.exceptions import Ignore, Retry

from . import signals
from .config import SemaphoreConfig, task_config
from .core import (
    Permit,
    Place,
    Semaphore,
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreTimeout,
    StaleHandover,
    WaitingForPermit,
)
from .gates import (
    GATES_HEADER,
    HANDOVER_SUFFIX,
    QUEUE_HEADER,
    WAIT_HEADER,
    Gate,
    decode_gates,
    semaphore_of,
    task_gate,
)
from .handover import HANDOVER_KEY, encode

logger = logging.getLogger(__name__)

WAITS_MARK = "celery_semaphore_waits"
MIN_COUNTDOWN = 0.02
PLACE_GRACE = 5.0


@dataclass
class WaitState:
    """What a waiting task carries across its retries, in the ``celery_semaphore`` header.

    ``waits`` counts every wait of the task (they are in ``request.retries``);
    ``period_start`` is how many of them came before the current wait period
    (a retry of the task's own starts a new one: new place, fresh wait budget).
    """

    tickets: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    first_ask: float | None = None
    period_start: int = 0
    handover: tuple[str, int] | None = None  # set by the publisher of a parked task

    @property
    def period_waits(self) -> int:
        return self.waits - self.period_start

    @classmethod
    def of(cls, request: Any) -> WaitState:
        raw = getattr(request, WAIT_HEADER, None)
        if not isinstance(raw, dict):
            return cls()
        tickets = raw.get("tickets") or {}
        handover = raw.get(HANDOVER_KEY)
        return cls(
            {str(k): int(v) for k, v in tickets.items() if v},
            int(raw.get("waits") or 0),
            raw.get("first_ask"),
            int(raw.get("period_start") or 0),
            (str(handover[0]), int(handover[1])) if handover else None,
        )

    def encode(self) -> dict[str, Any]:
        return {
            "tickets": self.tickets,
            "waits": self.waits,
            "first_ask": self.first_ask,
            "period_start": self.period_start,
        }


def gates_of(task: Any, request: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Gate]:
    """The gates the worker's main process computed, or, where it did not, the task's own."""
    raw = getattr(request, GATES_HEADER, None)
    if raw is not None:
        return decode_gates(raw)
    gate = task_gate(task, args, kwargs)
    return [gate] if gate else []


def estimate_turn(place: Place) -> float | None:
    """Seconds until ``place`` is likely served: its position times the pace of the
    line, the time between grants measured on the server while others waited (slower
    than hold / limit when hand-overs are slow), at most twice hold / limit: when
    tasks come back late the permits idle and the measured pace slows down, which
    would send them back later still."""
    if place.draining:
        return None
    capacity = place.hold_estimate / max(place.limit, 1) if place.hold_estimate else None
    pace = place.grant_interval or capacity
    if pace is None:
        return None
    if capacity is not None:
        pace = min(pace, 2 * capacity)
    return place.position * pace


def should_wait_in_place(place: Place, max_block: float) -> bool:
    """Only the next ``limit`` in line wait in place, and only for a turn due soon."""
    if max_block <= 0 or place.draining or place.position > place.limit:
        return False
    turn = estimate_turn(place)
    return turn is None or turn <= max_block


def countdown(waits: int, place: Place | None, config: SemaphoreConfig) -> float:
    """When to ask again: half a hold before the estimated turn (so the request
    arrives among the next ``limit`` and waits in place briefly), else
    exponential backoff with full jitter when the semaphore can't estimate."""
    turn = estimate_turn(place) if place is not None else None
    if turn is not None and place is not None and place.hold_estimate is not None:
        early = turn - place.hold_estimate / 2
        delay = early * (random.uniform(0.85, 0.95) if config.backoff_jitter else 0.9)
    else:
        cap = min(config.backoff_max, config.backoff_base * 2.0 ** min(waits, 64))
        delay = random.uniform(0.0, cap) if config.backoff_jitter else cap
    return min(max(delay, MIN_COUNTDOWN), config.backoff_max)


def _info(task: Any, request: Any) -> str:
    return json.dumps({"task": task.name, "worker": request.hostname, "pid": os.getpid()})


class Admission:
    """Taking (and later giving back) the permits of one execution of a task."""

    def __init__(self, task: Any, request: Any, gates: list[Gate], config: SemaphoreConfig):
        self.task = task
        self.request = request
        self.gates = gates
        self.config = config
        self.state = WaitState.of(request)
        self.permits: list[tuple[Gate, Permit]] = []

    def _sem(self, gate: Gate) -> Semaphore:
        return semaphore_of(self.task.app, gate, self.config)

    def enter(self) -> None:
        """Take every gate's permit, or raise ``Retry`` / `SemaphoreTimeout`."""
        info = _info(self.task, self.request)
        if self.state.first_ask is None:
            self.state.first_ask = time.time()
        try:
            for index, gate in enumerate(self.gates):
                result = self._attempt(gate, info)
                if isinstance(result, Place):
                    # Never hold one permit while waiting for another: give back the
                    # earlier gates' permits, wait for this one holding nothing, then
                    # take the earlier ones again (their tickets keep their places).
                    self.exit()
                    result = self._wait_in_place(gate, result, info)
                    if isinstance(result, Place):
                        self._come_back_later(gate, result, info)
                    self._granted(gate, result)
                    for earlier in self.gates[:index]:
                        again = self._attempt(earlier, info)
                        if isinstance(again, Place):
                            self.exit()
                            self._come_back_later(earlier, again, info)
                        self._granted(earlier, again)
                else:
                    self._granted(gate, result)
        except StaleHandover as stale:
            self.exit()
            logger.info(
                "%s[%s]: dropped an older copy of this task (semaphore %s handed over a "
                "newer one, or the task was served already)",
                self.task.name,
                self.request.id,
                stale.name,
            )
            raise Ignore() from None
        except (SemaphoreConnectionError, SemaphoreBackendError) as error:
            self._on_redis_error(error)

    def _attempt(self, gate: Gate, info: str) -> Permit | Place:
        ticket = self.state.tickets.get(gate.name)
        handover = None
        if self.state.handover is not None and self.state.handover[0] == gate.name:
            handover, self.state.handover = self.state.handover[1], None
        result = self._sem(gate).attempt(
            self.request.id, ticket, wait_lease=PLACE_GRACE, info=info, handover=handover
        )
        if isinstance(result, Place):
            self.state.tickets[gate.name] = result.ticket
        return result

    def _granted(self, gate: Gate, permit: Permit) -> None:
        self.permits.append((gate, permit))
        first_ask = self.state.first_ask or time.time()
        self._send(signals.permit_granted, gate, waited=time.time() - first_ask)

    def _wait_in_place(self, gate: Gate, place: Place, info: str) -> Permit | Place:
        if not should_wait_in_place(place, self.config.max_block):
            return place
        return self._sem(gate).wait_for_turn(
            self.config.max_block,
            self.request.id,
            place.ticket,
            wait_lease=self.config.max_block + PLACE_GRACE,
            info=info,
        )

    def _come_back_later(self, gate: Gate, place: Place | None, info: str) -> NoReturn:
        waited = time.time() - (self.state.first_ask or time.time())
        config = self.config
        waits = self.state.period_waits
        over_count = config.max_waits is not None and waits >= config.max_waits
        over_time = config.max_wait_time is not None and waited >= config.max_wait_time
        if over_count or over_time:
            self.drop_places()
            raise SemaphoreTimeout(
                gate.name,
                place.limit if place else gate.limit,
                waited,
                f"task {self.task.name}[{self.request.id}] gave up after {waits} "
                "waits (semaphore_max_waits / semaphore_max_wait_time)",
            )
        if place is not None and config.wait_mode == "handover":
            self._park(gate, place, info)
        delay = countdown(waits, place, config)
        if place is not None and delay > PLACE_GRACE / 2:  # the place would lapse first
            refreshed = self._sem(gate).attempt(
                self.request.id, place.ticket, wait_lease=delay * 1.5 + PLACE_GRACE, info=info
            )
            if isinstance(refreshed, Permit):
                refreshed.release()
        self._send(
            signals.permit_waiting, gate, position=place.position if place else 0, countdown=delay
        )
        self.state.waits += 1
        raise self._retry(delay, gate, place.position if place else 0)

    def _park(self, gate: Gate, place: Place, info: str) -> None:
        """Leave the retry's message beside the place in line and end as a retry that
        publishes nothing; the semaphore hands it over when its turn comes. Returns
        (to retry with a countdown instead) when the message can't be parked."""
        self.state.waits += 1
        queue = getattr(self.request, QUEUE_HEADER, None)
        signature = self._signature(queue=queue + HANDOVER_SUFFIX if queue else None)
        try:
            payload = encode(self.task.app, signature, self.config.park_max_bytes)
            parked = self._sem(gate).park(
                self.request.id, payload, place.ticket, info=info, due=self._budget_left()
            )
        except (ValueError, TypeError, SemaphoreError) as error:
            self.state.waits -= 1
            logger.info(
                "%s[%s] is not parked (retried with a countdown): %s",
                self.task.name,
                self.request.id,
                error,
            )
            return
        self._send(signals.permit_waiting, gate, position=parked.position, countdown=None)
        reason = self._reason(gate, parked.position)
        raise Retry(str(reason), reason)

    def _budget_left(self) -> float | None:
        """Seconds until the wait budget (``semaphore_max_wait_time``) runs out."""
        if self.config.max_wait_time is None:
            return None
        waited = time.time() - (self.state.first_ask or time.time())
        return max(0.0, self.config.max_wait_time - waited)

    def _signature(self, queue: str | None = None, **options: Any) -> Any:
        """The message that brings this request back, with its wait state, to its
        queue (its consumed queue's, when it came by a handover queue) or ``queue``."""
        request = self.request
        headers = {**(request.headers or {}), WAIT_HEADER: self.state.encode()}
        headers.pop(GATES_HEADER, None)
        return self.task.signature_from_request(
            request, None, None, queue or home_queue(request), retries=request.retries + 1,
            headers=headers, **options,
        )  # fmt: skip

    def _reason(self, gate: Gate, position: int) -> WaitingForPermit:
        """What Flower, the ``task-retried`` event and the result backend show."""
        return WaitingForPermit(gate.name, position, self.state.waits)

    def _retry(self, delay: float, gate: Gate, position: int) -> Retry:
        signature = self._signature(countdown=delay)
        signature.apply_async()
        reason = self._reason(gate, position)
        return Retry(str(reason), reason, when=delay, sig=signature)

    def _on_redis_error(self, error: Exception) -> None:
        policy = self.config.on_redis_error
        self.exit()
        if policy == "fail":
            raise error
        if policy == "run":
            logger.warning(
                "%s[%s] runs without a permit: %s", self.task.name, self.request.id, error
            )
            return
        logger.warning("%s[%s] will ask again: %s", self.task.name, self.request.id, error)
        self._come_back_later(self.gates[0], None, "")

    def exit(self) -> None:
        """Give back every permit taken; errors are logged (the lease is the backstop)."""
        while self.permits:
            gate, permit = self.permits.pop()
            try:
                released = permit.release()
            except (SemaphoreConnectionError, SemaphoreBackendError) as error:
                logger.warning("could not release %r (its lease will run out): %s", permit, error)
                continue
            if not released:
                logger.warning("%r was lost before the task ended", permit)
            self._send(signals.permit_released, gate, released=released)

    def drop_places(self) -> None:
        """Leave every line; a place Redis cannot be told about lapses on its own."""
        for gate in self.gates:
            try:
                self._sem(gate).release(self.request.id)
            except SemaphoreError as error:
                logger.warning(
                    "%s[%s] could not leave the line of %s (its place lapses): %s",
                    self.task.name,
                    self.request.id,
                    gate.name,
                    error,
                )

    def _send(self, signal: Any, gate: Gate, **fields: Any) -> None:
        signal.send(
            sender=self.task,
            semaphore=gate.name,
            task_id=self.request.id,
            task_name=self.task.name,
            **fields,
        )


def admitted_call(
    task: Any, body: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Run ``body`` holding the permits of every gate of the current request."""
    request = task.request
    if request.called_directly:
        return body(*args, **kwargs)
    gates = gates_of(task, request, args, kwargs)
    if not gates:
        return body(*args, **kwargs)
    admission = Admission(task, request, gates, task_config(task))
    if request.is_eager:
        return _eager_call(admission, body, args, kwargs)
    admission.enter()
    total, waits = request.retries, admission.state.waits
    request.retries = max(0, total - waits)
    setattr(request, WAITS_MARK, waits)
    try:
        return body(*args, **kwargs)
    finally:
        request.retries = total
        setattr(request, WAITS_MARK, None)
        admission.exit()


def _eager_call(
    admission: Admission, body: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Eager mode (``task_always_eager``, ``apply()``): take the permits now or fail; no retry."""
    info = _info(admission.task, admission.request)
    for gate in admission.gates:
        result = admission._sem(gate).attempt(admission.request.id, queue=False, info=info)
        if isinstance(result, Place):
            admission.exit()
            raise SemaphoreTimeout(
                gate.name,
                result.limit,
                0.0,
                "eager execution does not wait, and all permits are taken",
            )
        admission.permits.append((gate, result))
    try:
        return body(*args, **kwargs)
    finally:
        admission.exit()


def home_queue(request: Any) -> str | None:
    """For a request delivered by a handover queue, the queue it serves (where its
    retries go); None for any other (Celery then routes as it was delivered)."""
    routing_key = (getattr(request, "delivery_info", None) or {}).get("routing_key")
    if isinstance(routing_key, str) and routing_key.endswith(HANDOVER_SUFFIX):
        queue = getattr(request, QUEUE_HEADER, None)
        return queue if isinstance(queue, str) else routing_key[: -len(HANDOVER_SUFFIX)]
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
