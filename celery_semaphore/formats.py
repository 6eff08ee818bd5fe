"""The wire contract: everything celery-semaphore writes into Celery messages and Redis.

One owner for each format; every reader and writer goes through this module:

- the headers (`WAIT_HEADER`, `GATES_HEADER`, `QUEUE_HEADER`, `PARK_MARK`);
- the wait state a task carries across its waits (`WaitState`, in `WAIT_HEADER`);
- the gates a worker decided for a request (`Gate`, in `GATES_HEADER`);
- the hand-over queues (`handover_queue()`, `base_queue()`);
- a parked task's payload (`encode_signature()`, `encode_message()`, `decode_payload()`),
  versioned: a payload can wait in Redis for as long as a backlog lasts, across
  an upgrade of the workers.

Of the package it imports only two value types of the core (`RateLimit`, `Ask`),
which import nothing of the Celery side, so it cannot take part in an import cycle
(``tests/unit/test_layout.py`` keeps the package's import graph free of cycles, and
this module's imports to those two).

The ``celery_semaphore`` header (`WAIT_HEADER`)::

    {"tickets": {semaphore: ticket, ...},  # its places in line, one per gate
     "waits": 3,                           # waits so far (counted in request.retries)
     "first_ask": 1732480000.5,            # when its wait budget started (time.time())
     "period_start": 0,                    # waits before the current wait period
     "handover": [semaphore, token]}       # set by the publisher of a handed-over copy

A parked payload (JSON text), version 1::

    {"v": 1, "signature": [content type, encoding, "text" or "base64", body]}
        a waiting task's retry: ``dict(signature)`` serialized with the app's serializer
    {"v": 1, "message": [...as above...], "queue": queue or null, "options": {...}}
        a new task parked at publish: the message a producer was about to send
    {"v": 1, "broker": [parking queue, home queue]}
        a task whose message waits in the broker, in a parking queue
        (`celery_semaphore.parking_queues`): only where to take it from
Payloads written before the version field (a bare list, or the message form
without ``"v"``) are read as version 1; a higher version is refused with
`PayloadVersionError` (a newer package wrote it: a newer worker publishes it).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from celery.canvas import Signature
from kombu.serialization import dumps, loads, prepare_accept_content
from kombu.utils import json as kombu_json

from .core.ask import Ask
from .core.rates import RateLimit

WAIT_HEADER = "celery_semaphore"
GATES_HEADER = "celery_semaphore_gates"  # the gates the worker's main process decided
QUEUE_HEADER = "celery_semaphore_queue"  # the queue the worker's main process resolved
PARK_MARK = "celery_semaphore_may_park"  # a ParkingProducer publishes this message
HANDOVER_KEY = "handover"  # in WAIT_HEADER: [semaphore name, handover token]
MOVED_KEY = "moved"  # in WAIT_HEADER: true on a moved copy whose message the broker keeps

# Handed-over tasks travel on "<queue>.semaphore-handover", which the workers of
# <queue> consume too, so they do not wait behind the queue's backlog.
HANDOVER_SUFFIX = ".semaphore-handover"

PAYLOAD_VERSION = 1
# ``producer.publish`` keywords a parked message does not keep: how to send it
# (the publisher of the handover decides), and how its body was serialized
# (kept with the body).
NOT_KEPT = frozenset({
    "retry", "retry_policy", "declare", "timeout", "confirm_timeout", "serializer",
    "content_type", "content_encoding",
})  # fmt: skip


# Hand-over queues ---------------------------------------------------------------


def handover_queue(queue: str) -> str:
    """The queue on which ``queue``'s handed-over tasks travel."""
    return queue + HANDOVER_SUFFIX


# Messages of waiting tasks wait in "<queue>.semaphore-parked.<semaphore>[...]" on an
# AMQP broker (`celery_semaphore.parking_queues`); no worker consumes them.
PARKING_INFIX = ".semaphore-parked."
#: A parking queue's name is at most this long (AMQP allows 255 bytes).
PARKING_NAME_MOST = 200


def parking_queue(queue: str, gate: Gate, *, asked: bool = False) -> str:
    """Where the messages of ``queue``'s tasks waiting at ``gate`` park (on an AMQP
    broker): one queue per semaphore, fair-share account and priority, so that a
    queue's order is its part of the line's order; ``asked``: the one for tasks that
    reached a worker and asked before they parked (their tickets are older than
    those of the tasks parked at publish meanwhile: a queue of their own keeps each
    queue's arrival order close to its tickets' order). A name too long to be a
    queue's ends with a digest instead."""
    name = queue + PARKING_INFIX + gate.name
    if gate.fair_key is not None:
        name += f".account-{gate.fair_key}"
    if gate.priority:
        name += f".priority{gate.priority}"
    if asked:
        name += ".asked"
    if len(name.encode()) <= PARKING_NAME_MOST:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return queue[:80] + PARKING_INFIX + digest


def is_handover_queue(name: str | None) -> bool:
    return isinstance(name, str) and name.endswith(HANDOVER_SUFFIX)


def base_queue(name: str | None) -> str | None:
    """The queue a handover queue serves (any other name as it is)."""
    if name is not None and is_handover_queue(name):
        return name[: -len(HANDOVER_SUFFIX)]
    return name


# Gates ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """A semaphore a request passes: its name, the limit it declares (the largest
    there is where it declares only a rate), the family of a key function's
    semaphores (metrics.py shows a family as one series), and its rate, if any."""

    name: str
    limit: int
    family: str = ""
    rate: RateLimit | None = None
    #: Its limits that only count, never refuse: some of "limit", "rate".
    shadow: frozenset[str] = frozenset()
    #: The permits this request takes, and its rate's starts (`celery_semaphore.limits`).
    weight: int = 1
    rate_weight: int = 1
    #: Its place in the line: the message's priority (higher first: see
    #: `celery_semaphore.gates.urgency`), and on a fair limit the account whose turn it
    #: takes and that account's weight.
    priority: int = 0
    fair_key: str | None = None
    fair_weight: int = 1

    @cached_property
    def ask(self) -> Ask:
        """What the request asks of the gate's semaphore (``Semaphore.attempt(ask=...)``
        and the like)."""
        return Ask(self.weight, self.rate_weight, self.priority, self.fair_key, self.fair_weight)

    def encode(self) -> list[Any]:
        """[name, limit], then family, rate, shadow, "<weight>|<rate weight>" and
        "<priority>[|<fair weight>|<fair key>]" where any is set."""
        rate = "" if self.rate is None else self.rate.encode()
        weights = (
            "" if self.weight == self.rate_weight == 1 else f"{self.weight}|{self.rate_weight}"
        )
        order = ""
        if self.fair_key is not None:
            order = f"{self.priority}|{self.fair_weight}|{self.fair_key}"
        elif self.priority:
            order = str(self.priority)
        tail = [self.family, rate, ",".join(sorted(self.shadow)), weights, order]
        while tail and not tail[-1]:
            tail.pop()
        return [self.name, self.limit, *tail]

    @classmethod
    def decode(cls, raw: Any) -> Gate:
        name, limit, *rest = raw
        if len(rest) > 5 or not all(isinstance(item, str) for item in rest):
            raise ValueError(
                f"a gate is [name, limit] followed by up to five texts (family, rate, "
                f"shadow limits, weights, order), got {raw!r}"
            )
        family, rate, shadow, weights, order = [*rest, "", "", "", "", ""][:5]
        kinds = frozenset(shadow.split(",")) if shadow else frozenset()
        weight, _, rate_weight = weights.partition("|")
        priority, fair_weight, fair_key = [*order.split("|", 2), None, None][:3]
        return cls(
            str(name), int(limit), family, RateLimit.decode(rate), kinds,
            int(weight or 1), int(rate_weight or 1), int(priority or 0), fair_key,
            int(fair_weight or 1),
        )  # fmt: skip


def encode_gates(gates: Sequence[Gate]) -> list[list[Any]]:
    return [g.encode() for g in gates]


def decode_gates(raw: Any) -> list[Gate]:
    if not raw:
        return []
    return [Gate.decode(item) for item in raw]


def recorded_gates(request: Any) -> list[Gate]:
    """The gates the main process recorded on a worker Request, or on the Context
    a revoke (or the child's own request) carries."""
    raw = None
    request_dict = getattr(request, "request_dict", None)
    if isinstance(request_dict, dict):
        raw = request_dict.get(GATES_HEADER)
    if raw is None:
        raw = getattr(request, GATES_HEADER, None)
    if raw is None:
        raw = (getattr(request, "headers", None) or {}).get(GATES_HEADER)
    return decode_gates(raw)


# The wait state -------------------------------------------------------------------


@dataclass
class WaitState:
    """What a waiting task carries across its retries, in the ``celery_semaphore`` header.

    ``waits`` counts every wait of the task (they are in ``request.retries``);
    ``period_start`` is how many of them came before the current wait period
    (a retry of the task's own starts a new one: new place, fresh wait budget).
    ``handover`` is set only on a copy published by a hand-over (the semaphore's
    name and the copy's token); it is never written back. ``unplaced``: the tickets
    are publish times, not places in a line (`celery_semaphore.room_at_publish`).
    ``moved``: on a copy moved out of a parking queue of a Redis broker, whose start
    forgets the copy kept there (`celery_semaphore.parking_lists`).
    """

    tickets: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    first_ask: float | None = None
    period_start: int = 0
    handover: tuple[str, int] | None = None
    unplaced: bool = False
    moved: bool = False

    @property
    def period_waits(self) -> int:
        return self.waits - self.period_start

    @classmethod
    def of(cls, request: Any) -> WaitState:
        """The state on a request (a task's ``self.request``, or a revoke's Context),
        as an attribute or in its headers; an empty one where it has none."""
        raw = getattr(request, WAIT_HEADER, None)
        if raw is None:
            raw = (getattr(request, "headers", None) or {}).get(WAIT_HEADER)
        return cls.decode(raw)

    @classmethod
    def in_headers(cls, headers: dict[str, Any] | None) -> WaitState:
        return cls.decode((headers or {}).get(WAIT_HEADER))

    @classmethod
    def decode(cls, raw: Any) -> WaitState:
        if not isinstance(raw, dict):
            return cls()
        tickets = raw.get("tickets")
        handover = raw.get(HANDOVER_KEY)
        return cls(
            {str(k): int(v) for k, v in tickets.items() if k and v}
            if isinstance(tickets, dict)
            else {},
            int(raw.get("waits") or 0),
            raw.get("first_ask"),
            int(raw.get("period_start") or 0),
            (str(handover[0]), int(handover[1])) if handover else None,
            raw.get("unplaced") is True,
            raw.get(MOVED_KEY) is True,
        )

    def encode(self) -> dict[str, Any]:
        encoded = {
            "tickets": self.tickets,
            "waits": self.waits,
            "first_ask": self.first_ask,
            "period_start": self.period_start,
        }
        if self.unplaced:
            encoded["unplaced"] = True
        return encoded


def has_wait_state(headers: dict[str, Any]) -> bool:
    """Whether a message carries a wait state (a retry of a waiting task, a hand-over,
    or a new task that took its places at publish)."""
    return WAIT_HEADER in headers


def with_handover(
    headers: dict[str, Any] | None, semaphore: str, token: int, *, moved: bool = False
) -> dict[str, Any]:
    """``headers`` with a hand-over's mark: the copy's semaphore and token, and whether
    a copy of it is kept in the broker until its task starts (``moved``:
    `celery_semaphore.parking_lists`)."""
    headers = dict(headers or {})
    state = dict(headers.get(WAIT_HEADER) or {})
    state[HANDOVER_KEY] = [semaphore, token]
    if moved:
        state[MOVED_KEY] = True
    else:
        state.pop(MOVED_KEY, None)
    headers[WAIT_HEADER] = state
    return headers


# Parked payloads ------------------------------------------------------------------


class TooLarge(ValueError):
    """The task's message is larger than ``semaphore_park_max_bytes``."""


class PayloadVersionError(ValueError):
    """A parked payload written by a newer celery-semaphore than this one."""


@dataclass(frozen=True)
class ParkedMessage:
    """A message a producer was about to publish: its serialized body, the queue it
    was sent to (None: publish it as it was addressed), and the rest of the
    publish keywords."""

    content_type: str
    content_encoding: str
    body: str | bytes
    queue: str | None
    options: dict[str, Any]


def _pack(content_type: str, encoding: str, body: str | bytes) -> list[str]:
    if isinstance(body, bytes):
        return [content_type, encoding, "base64", base64.b64encode(body).decode("ascii")]
    return [content_type, encoding, "text", body]


def _unpack(body_encoding: str, body: str) -> str | bytes:
    return base64.b64decode(body) if body_encoding == "base64" else body


def _checked(payload: str, max_bytes: int) -> str:
    if len(payload) > max_bytes:
        raise TooLarge(f"the task's message is {len(payload)} bytes, over {max_bytes}")
    return payload


def encode_signature(app: Any, signature: Signature, max_bytes: int) -> str:
    """``signature`` as a payload to park (raises TooLarge, or the serializer's error)."""
    packed = _pack(*dumps(dict(signature), serializer=app.conf.task_serializer))  # type: ignore[no-untyped-call]
    return _checked(json.dumps({"v": PAYLOAD_VERSION, "signature": packed}), max_bytes)


def encode_message(
    app: Any, body: Any, publish: dict[str, Any], queue: str | None, max_bytes: int
) -> str:
    """A message a producer was about to publish (``producer.publish(body, **publish)``)
    as a payload to park, with ``queue``, the queue it was sent to. The body is
    serialized now, as the producer would have; the rest must be JSON (Celery's
    headers and properties are; anything else raises TypeError)."""
    serializer = publish.get("serializer") or app.conf.task_serializer
    packed = _pack(*dumps(body, serializer=serializer))  # type: ignore[no-untyped-call]
    options = {k: v for k, v in publish.items() if k not in NOT_KEPT and v is not None}
    envelope = {"v": PAYLOAD_VERSION, "message": packed, "queue": queue, "options": options}
    return _checked(kombu_json.dumps(envelope), max_bytes)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class InBroker:
    """A task whose message waits in the broker, in ``parking`` (a queue no worker
    consumes); when its turn comes it is moved to ``home``'s handover queue."""

    parking: str
    home: str


def encode_in_broker(parking: str, home: str) -> str:
    """The payload of a task whose message waits in the parking queue ``parking``."""
    return json.dumps({"v": PAYLOAD_VERSION, "broker": [parking, home]})


def in_broker_around_ticket(parking: str, home: str) -> tuple[str, str]:
    """`encode_in_broker()` as the text before and after a ticket the store puts
    between them (``Semaphore.take_place_or_park()``): it reads ``"ticket"``."""
    payload = encode_in_broker(parking, home)
    return payload[:-1] + ', "ticket": ', "}"


def decode_payload(app: Any, payload: str) -> Signature | ParkedMessage | InBroker:
    """What `encode_signature()`, `encode_message()` or `encode_in_broker()` parked."""
    parked = kombu_json.loads(payload)  # type: ignore[no-untyped-call]
    if isinstance(parked, list):  # before the version field: a signature
        parked = {"v": 1, "signature": parked}
    version = parked.get("v", 1) if isinstance(parked, dict) else None
    if not isinstance(version, int) or version > PAYLOAD_VERSION:
        raise PayloadVersionError(
            f"a parked payload of version {version!r}; this celery-semaphore reads up to "
            f"version {PAYLOAD_VERSION} (a newer worker wrote it: upgrade this one)"
        )
    if "broker" in parked:
        parking, home = parked["broker"]
        return InBroker(str(parking), str(home))
    if "signature" in parked:
        content_type, encoding, body_encoding, body = parked["signature"]
        data = _unpack(body_encoding, body)
        accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]
        fields = loads(data, content_type, encoding, accept=accept)  # type: ignore[no-untyped-call]
        return Signature.from_dict(fields, app=app)
    content_type, encoding, body_encoding, body = parked["message"]
    return ParkedMessage(
        content_type, encoding, _unpack(body_encoding, body), parked["queue"],
        dict(parked["options"]),
    )  # fmt: skip
