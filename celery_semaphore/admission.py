"""Admission in the process that runs the task body: permits taken before it, given back after.

Before the body runs, the request takes a permit of each of its gates (queue
cap, task semaphores): with two or more, all in one script call or none
(`celery_semaphore.core.SemaphoreSet`), so it never holds one permit while
waiting for another, and waits with one ticket in every line that refused it.
Where one call cannot reach them all (a Redis Cluster, the gates in different
slots) they are taken one after the other, and a refusal gives back what was
taken. What a refused request does
next is decided by `celery_semaphore.waiting` and carried out as a Celery
retry by `celery_semaphore.retry`::

    attempt -> refused, position 12, limit 4, holds ~0.2 s -> turn in ~0.6 s
            -> park (handover mode) or retry(countdown ~0.5 s); the headers carry
               {tickets, waits, first_ask}
    attempt -> refused, position 2 -> turn in ~0.1 s -> wait in place (pub/sub)
            -> granted -> body runs -> released in ``finally``
"""

from __future__ import annotations

import abc
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery.exceptions import Ignore, Retry

from . import events, signals
from .config import SemaphoreConfig, get_config, task_config
from .core import (
    Permit,
    PermitSet,
    Place,
    Places,
    Semaphore,
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreSet,
    SemaphoreTimeout,
    StaleHandover,
)
from .formats import GATES_HEADER, Gate, WaitState, decode_gates
from .gates import joint_of, semaphore_of, task_gates, urgency
from .kept_permits import Keeper, Kept, keepable, keeper_of, may_start_on_kept
from .limits import RateLimited
from .parking_queues import forget_moved_copy
from .retry import WAITS_MARK, Waits
from .state import state_of
from .waiting import PLACE_GRACE, Countdown, GiveUp, Park, binding

logger = logging.getLogger(__name__)

#: A place refreshed before a countdown may turn out to be the task's turn: it then
#: takes its other gates again, at most this many times before it goes anyway.
REFRESH_TURNS = 2


@dataclass(frozen=True)
class Refused:
    """The gate that refused the request, and where the request stands there."""

    gate: Gate
    place: Place


def gates_of(task: Any, request: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Gate]:
    """The gates the worker's main process computed, or, where it did not, the task's own."""
    raw = getattr(request, GATES_HEADER, None)
    if raw is not None:
        return decode_gates(raw)
    priority = (getattr(request, "delivery_info", None) or {}).get("priority")
    return task_gates(task, args, kwargs, urgency(task.app, priority))


def _info(task: Any, request: Any) -> str:
    return _info_text(task.name, request.hostname, os.getpid())


@functools.lru_cache(maxsize=256)
def _info_text(task_name: str, hostname: str | None, pid: int) -> str:
    """The info a request leaves beside its permit or place: the same text for every
    request of one task in one process, so it is made once."""
    return json.dumps({"task": task_name, "worker": hostname, "pid": pid})


class Admission(abc.ABC):
    """Taking (and later giving back) the permits of one execution of a task.

    It keeps the request's places in line (the tickets of its `WaitState`) and
    the permits it holds; it decides nothing about waiting. Two ways to take the
    permits, one class each: `JointAdmission` (two or more gates that one script
    call reaches: all in one step or none) and `EachAdmission` (one gate, or gates
    one call cannot reach together: one after the other). `Admission.of()` picks.
    """

    def __init__(
        self, task: Any, request: Any, gates: list[Gate], config: SemaphoreConfig, state: WaitState
    ) -> None:
        self.task = task
        self.request = request
        self.gates = gates
        self.config = config
        self.state = state
        self.info = _info(task, request)
        self.permits: dict[Gate, Permit] = {}

    @staticmethod
    def of(
        task: Any, request: Any, gates: list[Gate], config: SemaphoreConfig, state: WaitState
    ) -> Admission:
        """The admission of these gates: joint where one script call reaches them all."""
        joint = joint_of(task.app, gates, config)
        if joint is not None:
            return JointAdmission(task, request, gates, config, state, joint=joint)
        return EachAdmission(task, request, gates, config, state)

    @abc.abstractmethod
    def enter(self, in_place_for: Callable[[Place], float | None]) -> Refused | None:
        """Take every gate's permit not held yet: None once all are held, else the
        refusal (holding nothing then). A refused gate where ``in_place_for(place)``
        gives seconds is waited for in place, holding nothing.
        Raises `StaleHandover` (holding nothing) for a stale copy of a handed-over task."""

    @abc.abstractmethod
    def take_now(self) -> Refused | None:
        """Every gate's permit now, without a place in line (eager execution)."""

    @abc.abstractmethod
    def refresh(self, gate: Gate, place: Place, seconds: float) -> bool:
        """Keep the place at ``gate`` for ``seconds``; True if that found the turn
        come (the permit is then held, and `enter()` takes the other gates; with a
        joint set, every gate's: the places are kept in every refusing line)."""

    def _sem(self, gate: Gate) -> Semaphore:
        return semaphore_of(self.task.app, gate, self.config)

    def _granted(self, gate: Gate, permit: Permit) -> None:
        self.permits[gate] = permit
        first_ask = self.state.first_ask or time.time()
        self._send(signals.permit_granted, gate, waited=time.time() - first_ask)
        if permit.shadow_refused:
            self._send(
                signals.shadow_refused,
                gate,
                limits=sorted(permit.shadow_refused),
                would_wait=permit.shadow_wait,
            )

    def exit(self, *, unused: bool = False) -> None:
        """Give back every permit taken; errors are logged (the lease is the backstop).
        ``unused``: before the body ran (another gate refused): under a rate, the
        grants are given back too, so a start that did not happen spends nothing."""
        while self.permits:
            gate, permit = self.permits.popitem()
            try:
                released = permit.give_back_unused() if unused else permit.release()
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
        if not events.listened(signal, self.task.app):
            return
        signal.send(
            sender=self.task,
            semaphore=gate.name,
            task_id=self.request.id,
            task_name=self.task.name,
            **fields,
        )


class JointAdmission(Admission):
    """Every gate in one script call (`celery_semaphore.core.SemaphoreSet`): it never
    holds one permit while waiting for another, and waits with one ticket in every
    line that refused it; the gate that binds (`waiting.binding`) is the one it waits
    for, in place or not."""

    def __init__(
        self,
        task: Any,
        request: Any,
        gates: list[Gate],
        config: SemaphoreConfig,
        state: WaitState,
        *,
        joint: SemaphoreSet,
    ) -> None:
        super().__init__(task, request, gates, config, state)
        self.joint = joint

    def enter(self, in_place_for: Callable[[Place], float | None]) -> Refused | None:
        if all(gate in self.permits for gate in self.gates):
            return None
        try:
            result = self._attempt(PLACE_GRACE)
            if isinstance(result, Places):
                refused = self._binding(result)
                seconds = in_place_for(refused.place)
                if seconds is None:
                    return refused
                result = self._wait(seconds, result)
                if isinstance(result, Places):
                    return self._binding(result)
            self._granted_all(result)
        except BaseException:
            self.exit(unused=True)
            raise
        return None

    def take_now(self) -> Refused | None:
        joint = self._attempt(PLACE_GRACE, queue=False)
        if isinstance(joint, Places):
            return self._binding(joint)
        self._granted_all(joint)
        return None

    def refresh(self, gate: Gate, place: Place, seconds: float) -> bool:
        joint = self._attempt(seconds)
        if isinstance(joint, Places):
            return False
        self._granted_all(joint)
        return True

    def _attempt(self, wait_lease: float, *, queue: bool = True) -> PermitSet | Places:
        handover = None
        if self.state.handover is not None:
            names = [gate.name for gate in self.gates]
            name, token = self.state.handover
            if name in names:
                handover, self.state.handover = (names.index(name), token), None
        result = self.joint.attempt(
            self.request.id, self._ticket(), queue=queue, wait_lease=wait_lease,
            info=self.info, handover=handover, weights=[g.weight for g in self.gates],
            rate_weights=[g.rate_weight for g in self.gates], **self._order(),
        )  # fmt: skip
        self._keep_ticket(result)
        return result

    def _wait(self, seconds: float, refused: Places) -> PermitSet | Places:
        result = self.joint.wait_for_turn(
            seconds, self.request.id, self._ticket(),
            wait_lease=seconds + PLACE_GRACE, info=self.info,
            weights=[g.weight for g in self.gates],
            rate_weights=[g.rate_weight for g in self.gates], **self._order(), refused=refused,
        )  # fmt: skip
        self._keep_ticket(result)
        return result

    def _ticket(self) -> int | None:
        """The ticket the set presents: its place in a fair line (at its account's turn),
        else the earliest of its places."""
        tickets = self.state.tickets
        for gate in self.gates:
            if gate.fair_key is not None:
                return tickets.get(gate.name) or None
        return min((t for t in (tickets.get(g.name) for g in self.gates) if t), default=None)

    def _order(self) -> dict[str, Any]:
        """The set's priority and fair key (of at most one gate: `gates.joint_of`)."""
        fair = [g for g in self.gates if g.fair_key is not None]
        return {
            "priority": self.gates[0].priority,
            "fair_keys": [g.fair_key for g in self.gates] if fair else None,
            "fair_weight": fair[0].fair_weight if fair else None,
        }

    def _keep_ticket(self, result: PermitSet | Places) -> None:
        if isinstance(result, Places) and result.ticket:
            for gate in self.gates:
                self.state.tickets[gate.name] = result.ticket

    def _binding(self, places: Places) -> Refused:
        index = binding(places.places, places.refused_by)
        return Refused(self.gates[index], places.places[index])

    def _granted_all(self, permits: PermitSet) -> None:
        for gate, permit in zip(self.gates, permits, strict=True):
            self._granted(gate, permit)


class EachAdmission(Admission):
    """One gate after the other (one gate, or gates one script call cannot reach
    together: a Redis Cluster, the gates in different slots): a refusal gives back
    what was taken; after a wait in place, the earlier gates' permits are taken again
    (their tickets keep their places)."""

    def enter(self, in_place_for: Callable[[Place], float | None]) -> Refused | None:
        try:
            for index, gate in enumerate(self.gates):
                if gate in self.permits:
                    continue
                result = self._attempt(gate)
                if isinstance(result, Permit):
                    self._granted(gate, result)
                    continue
                self.exit(unused=True)
                seconds = in_place_for(result)
                if seconds is not None:
                    result = self._wait(gate, result, seconds)
                if isinstance(result, Place):
                    return Refused(gate, result)
                self._granted(gate, result)
                for earlier in self.gates[:index]:
                    again = self._attempt(earlier)
                    if isinstance(again, Place):
                        self.exit(unused=True)
                        return Refused(earlier, again)
                    self._granted(earlier, again)
        except BaseException:
            self.exit(unused=True)
            raise
        return None

    def take_now(self) -> Refused | None:
        for gate in self.gates:
            result = self._sem(gate).attempt(
                self.request.id, queue=False, info=self.info, ask=gate.ask,
            )  # fmt: skip
            if isinstance(result, Place):
                self.exit(unused=True)
                return Refused(gate, result)
            self._granted(gate, result)
        return None

    def refresh(self, gate: Gate, place: Place, seconds: float) -> bool:
        result = self._sem(gate).attempt(
            self.request.id, place.ticket, wait_lease=seconds, info=self.info,
            ask=gate.ask,
        )  # fmt: skip
        if isinstance(result, Place):
            return False
        self._granted(gate, result)
        return True

    def _attempt(self, gate: Gate) -> Permit | Place:
        ticket = self.state.tickets.get(gate.name)
        handover = None
        if self.state.handover is not None and self.state.handover[0] == gate.name:
            handover, self.state.handover = self.state.handover[1], None
        result = self._sem(gate).attempt(
            self.request.id, ticket, wait_lease=PLACE_GRACE, info=self.info, handover=handover,
            ask=gate.ask,
        )  # fmt: skip
        if isinstance(result, Place):
            self.state.tickets[gate.name] = result.ticket
        return result

    def _wait(self, gate: Gate, place: Place, seconds: float) -> Permit | Place:
        return self._sem(gate).wait_for_turn(
            seconds, self.request.id, place.ticket, wait_lease=seconds + PLACE_GRACE,
            info=self.info, ask=gate.ask, refused=place,
        )  # fmt: skip


def admitted_call(
    task: Any, body: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Run ``body`` holding the permits of every gate of the current request."""
    request = task.request
    if request.called_directly:
        return body(*args, **kwargs)
    state = WaitState.of(request)
    if state.moved and not request.is_eager:  # whether it asks or not (no gates here now)
        forget_moved_copy(
            state_of(task.app).semaphores.broker_link, get_config(task.app).namespace, request.id
        )
    gates = gates_of(task, request, args, kwargs)
    if not gates:
        return body(*args, **kwargs)
    config = task_config(task)
    keeper = _keeper(task, request, gates, config)
    kept = None if keeper is None or not may_start_on_kept(state) else keeper.take(gates[0])
    if keeper is not None and kept is not None:
        return _call_on_kept(task, kept, keeper, functools.partial(body, *args, **kwargs))
    admission = Admission.of(task, request, gates, config, state)
    if request.is_eager:
        return _eager_call(admission, body, args, kwargs)
    waits = Waits(task, request, state, admission.config, admission.info)
    admit(admission, waits)
    total = request.retries
    request.retries = max(0, total - state.waits)
    setattr(request, WAITS_MARK, state.waits)
    try:
        return body(*args, **kwargs)
    except RateLimited as limited:
        request.retries = total  # its wait is a wait, counted as the others
        setattr(request, WAITS_MARK, None)  # and it keeps its places (not a new contender)
        raise slow_down(admission, waits, limited) from None
    finally:
        request.retries = total
        setattr(request, WAITS_MARK, None)
        if keeper is None:
            admission.exit()
        else:
            _keep_or_exit(admission, keeper)


def _keeper(task: Any, request: Any, gates: list[Gate], config: SemaphoreConfig) -> Keeper | None:
    """This process's `Keeper`, where the request may start on or keep a kept permit."""
    if config.keep_idle <= 0 or request.is_eager or not keepable(gates):
        return None
    app_state = state_of(task.app)
    if not app_state.keeps_permits:
        return None
    return keeper_of(app_state, request.hostname)


def _call_on_kept(task: Any, kept: Kept, keeper: Keeper, call: Callable[[], Any]) -> Any:
    """Run the body on the permit this process keeps (`celery_semaphore.kept_permits`):
    no call to the store; the permit stays kept after, unless a line formed meanwhile."""
    request = task.request
    setattr(request, WAITS_MARK, 0)
    try:
        return call()
    except RateLimited as limited:  # its gate has no rate: slow_down() says so
        state = WaitState.of(request)
        admission = Admission.of(task, request, [kept.gate], task_config(task), state)
        waits = Waits(task, request, state, admission.config, admission.info)
        raise slow_down(admission, waits, limited) from None
    finally:
        setattr(request, WAITS_MARK, None)
        keeper.put_back(kept)


def _keep_or_exit(admission: Admission, keeper: Keeper) -> None:
    """The task ended: keep its one permit for this process's next task if the store
    lets it (else it is released, as `Admission.exit` does)."""
    gate = admission.gates[0]
    permit = admission.permits.pop(gate, None)
    if permit is None:
        admission.exit()
        return
    info = _kept_info(admission.request.hostname, os.getpid())
    semaphore = admission._sem(gate)
    kept = keeper.keep(gate, semaphore, permit, info, admission.config)
    if kept == "lost":
        logger.warning("%r was lost before the task ended", permit)
    if kept in {"released", "lost"}:
        admission._send(signals.permit_released, gate, released=kept == "released")


@functools.lru_cache(maxsize=16)
def _kept_info(hostname: str | None, pid: int) -> str:
    return json.dumps({"kept_by": hostname, "pid": pid})


def slow_down(admission: Admission, waits: Waits, limited: RateLimited) -> Retry:
    """The body raised `RateLimited`: pause the rates it names (all of the request's,
    or ``limited.limit``'s) for ``retry_after``, then give the permits back (in that
    order: a release hands the next turn on, and the pause must already hold it), and come back
    then, first in line: the request stands in each paused line with its place (its
    ticket, or, where it was granted without waiting, its fencing token: its place
    when it was granted) until it comes back, and presents that place at its other
    gates too. The ``Retry`` to end with (a countdown, whatever the wait mode, of at
    most ``semaphore_backoff_max``: a longer one could outlast the Redis broker's
    visibility timeout; back early, the task finds the pause and waits again in its
    place)."""
    task, request, seconds = admission.task, admission.request, limited.retry_after
    paused = [
        gate
        for gate in admission.gates
        if gate.rate is not None and limited.limit in (None, gate.name)
    ]
    if not paused:
        rates = [gate.name for gate in admission.gates if gate.rate is not None]
        admission.exit()
        raise ValueError(
            f"task {task.name} raised {limited!r}, but "
            + (f"its rates are on {', '.join(rates)}" if rates else "it declares no rate")
            + ": declare rate= on its semaphore (or Rate(...) in limits=), or name one of "
            "its rates with RateLimited(retry_after, limit=NAME)"
        )
    tickets = admission.state.tickets
    for gate, permit in admission.permits.items():
        tickets.setdefault(gate.name, permit.fencing_token)
    semaphores = [(gate, semaphore_of(task.app, gate, admission.config)) for gate in paused]
    for _, semaphore in semaphores:  # before the permits go back: a release hands turns on
        semaphore.pause_rate(seconds)
    admission.exit()
    place: Place | None = None
    for gate, semaphore in semaphores:
        admission._send(signals.rate_limited, gate, retry_after=seconds)
        result = semaphore.attempt(
            request.id, tickets.get(gate.name), wait_lease=seconds + PLACE_GRACE,
            info=admission.info, ask=gate.ask,
        )  # fmt: skip
        if isinstance(result, Place):
            place = place or result
        else:  # not paused after all (its rate was taken away meanwhile)
            result.release()
    return waits.countdown(paused[0], place, min(seconds, admission.config.backoff_max))


def admit(admission: Admission, waits: Waits) -> None:
    """Return holding every permit (or none, under ``semaphore_on_redis_error =
    "run"``), or raise what ends this execution: a ``Retry`` (parked, or a countdown),
    ``Ignore`` (a stale copy), `SemaphoreTimeout` (the wait budget is spent)."""
    try:
        for turn in range(REFRESH_TURNS + 1):
            refused = admission.enter(waits.in_place_for)
            state_of(admission.task.app).redis_answered.set()
            if refused is None:
                return
            gate, place = refused.gate, refused.place
            decision = waits.decide(place, may_wait_in_place=False)
            if isinstance(decision, Park):
                retry = waits.park(gate, place, decision.due)
                if retry is not None:
                    raise retry
                decision = waits.decide(place, may_wait_in_place=False, may_park=False)
            if isinstance(decision, GiveUp):
                admission.drop_places()
                raise waits.give_up(gate, place, decision)
            assert isinstance(decision, Countdown)
            seconds = decision.refresh_place_for
            if seconds is not None and admission.refresh(gate, place, seconds):
                if turn < REFRESH_TURNS:
                    continue  # the turn came meanwhile: take the other gates now
                admission.exit(unused=True)
            raise waits.countdown(gate, place, decision.delay)
    except StaleHandover as stale:
        logger.info(
            "%s[%s]: dropped another copy of this task (a copy semaphore %s handed "
            "over arrived first, or the task was served already)",
            admission.task.name,
            admission.request.id,
            stale.name,
        )
        raise Ignore() from None
    except (SemaphoreConnectionError, SemaphoreBackendError) as error:
        _on_redis_error(admission, waits, error)


def _on_redis_error(admission: Admission, waits: Waits, error: Exception) -> None:
    """What ``semaphore_on_redis_error`` says. "retry" waits out an outage of a Redis
    that has answered this worker since it started; one that never has (a wrong URL or
    password, a server that is not running: a test's worker pointed at nothing) is a
    setting to fix, which no retry would: the task fails at once, as with "fail"."""
    admission.exit(unused=True)
    task, request = admission.task, admission.request
    policy = admission.config.on_redis_error
    if policy == "fail":
        raise error
    if policy == "retry" and not state_of(task.app).redis_answered:
        logger.error(
            "%s[%s] fails: the semaphores' store has not answered this worker since it "
            "started, so retrying would wait for a setting to change: %s",
            task.name,
            request.id,
            error,
        )
        raise error
    if policy == "run":
        logger.warning("%s[%s] runs without a permit: %s", task.name, request.id, error)
        return
    logger.warning("%s[%s] will ask again: %s", task.name, request.id, error)
    gate = admission.gates[0]
    decision = waits.decide(None)
    if isinstance(decision, GiveUp):
        admission.drop_places()
        raise waits.give_up(gate, None, decision)
    assert isinstance(decision, Countdown)
    raise waits.countdown(gate, None, decision.delay)


def _eager_call(
    admission: Admission, body: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Eager mode (``task_always_eager``, ``apply()``): take the permits now or fail; no retry."""
    refused = admission.take_now()
    if refused is not None:
        raise SemaphoreTimeout(
            refused.gate.name,
            refused.place.limit,
            0.0,
            "eager execution does not wait, and all permits are taken",
        )
    try:
        return body(*args, **kwargs)
    finally:
        admission.exit()
