"""The worker side: a bootstep with the lease heartbeat, and release by task id.

Who hears of each ending (prefork; see docs/guarantees.md):

- the child ends the body (success, exception, retry, Ignore, Reject, soft
  time limit): :mod:`.admission` releases in ``finally``;
- revoke, a killed child, a hard time limit, cold shutdown: only the main
  process hears of it; the handlers below release by task id (idempotent);
- the whole worker killed: nobody; the lease runs out (the backstop).

The main process also decides each request's gates when the message arrives
(``task_received``), so the child, the heartbeat and these handlers agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

import click
from celery import bootsteps
from celery.signals import task_failure, task_received, task_retry, task_revoked
from celery.worker import state as worker_state

from . import metrics, signals
from .admission import task_config
from .config import forget_config, get_config
from .connection import connect, mask_url
from .errors import SemaphoreError
from .gates import (
    GATES_HEADER,
    QUEUE_PREFIX,
    WAIT_HEADER,
    Gate,
    decode_gates,
    encode_gates,
    queue_gate,
    semaphores,
    task_gate,
)
from .patching import admit_every_task
from .publish import installed_apps

logger = logging.getLogger(__name__)


METRICS_PORT_OPTION = click.Option(
    ["--semaphore-metrics-port"],
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve celery-semaphore's Prometheus metrics on this port (needs the prometheus extra).",
)


def install(app: Any) -> None:
    """Add the worker bootstep to ``app`` (LimitedTask does this itself; call it
    when only ``semaphore_queue_limits`` is used). Idempotent."""
    app.steps["worker"].add(SemaphoreStep)
    app.user_options["worker"].add(METRICS_PORT_OPTION)
    installed_apps.add(app)


# -- the gates of each request, decided in the main process --------------------------------


def _consumed_queue(consumer: Any, delivery_info: dict[str, Any]) -> str | None:
    exchange = delivery_info.get("exchange") or ""
    routing_key = delivery_info.get("routing_key")
    task_consumer = getattr(consumer, "task_consumer", None)
    for queue in getattr(task_consumer, "queues", None) or ():
        queue_exchange = queue.exchange.name if queue.exchange is not None else ""
        if queue.routing_key == routing_key and queue_exchange == exchange:
            return str(queue.name)
    return routing_key


def _decide_gates(sender: Any = None, request: Any = None, **_: Any) -> None:
    task = request.task
    config = get_config(task.app)
    gates = []
    queue = queue_gate(_consumed_queue(sender, request.delivery_info or {}), config)
    if queue is not None:
        gates.append(queue)
    if getattr(task, "semaphore", None) is not None:
        try:
            own = task_gate(task, request.args, request.kwargs)
        except (TypeError, ValueError):
            request.request_dict.pop(GATES_HEADER, None)  # the child computes it and fails loudly
            return
        if own is not None:
            gates.append(own)
    if gates:
        request.request_dict[GATES_HEADER] = encode_gates(gates)
    else:
        request.request_dict.pop(GATES_HEADER, None)


def _gates_of(request: Any) -> list[Gate]:
    """Gates recorded on a worker Request, or on the Context a revoke reports."""
    raw = None
    request_dict = getattr(request, "request_dict", None)
    if isinstance(request_dict, dict):
        raw = request_dict.get(GATES_HEADER)
    if raw is None:
        raw = getattr(request, GATES_HEADER, None) or (getattr(request, "headers", None) or {}).get(
            GATES_HEADER
        )
    return decode_gates(raw)


# -- release by task id, for endings only the main process hears of --------------------------


def release_by_id(task: Any, task_id: str, gates: list[Gate]) -> None:
    if not gates or task is None:
        return
    config = task_config(task)
    for gate in gates:
        try:
            released = semaphores.get(gate, config).release(task_id)
        except SemaphoreError as error:
            logger.warning(
                "could not release %s of %s (lease runs out): %s", gate.name, task_id, error
            )
            continue
        if released:
            signals.permit_released.send(
                sender=task,
                semaphore=gate.name,
                task_id=task_id,
                task_name=task.name,
                released=True,
            )


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        release_by_id(sender, request.id, _gates_of(request) or _gates_waited_for(sender, request))


def _gates_waited_for(task: Any, request: Any) -> list[Gate]:
    """The gates where a request that never reached ``task_received`` holds a place in line.

    Celery discards a message of a task already known to be revoked before it
    sends ``task_received`` (so before :func:`_decide_gates`). The places the
    task took (at publish, or while waiting) are named by the tickets it
    carries; drop them now rather than let them block the line until they lapse.
    """
    if task is None:
        return []
    raw = getattr(request, WAIT_HEADER, None)
    if raw is None:
        raw = (getattr(request, "headers", None) or {}).get(WAIT_HEADER)
    tickets = raw.get("tickets") if isinstance(raw, dict) else None
    if not isinstance(tickets, dict):
        return []
    queue_limits = get_config(task.app).queue_limits
    gates = []
    for name in tickets:
        if not isinstance(name, str) or not name:
            continue
        if name.startswith(QUEUE_PREFIX):
            limit = queue_limits.get(name[len(QUEUE_PREFIX) :])
        else:
            limit = getattr(task, "limit", None)
        gates.append(Gate(name, limit if isinstance(limit, int) and limit > 0 else 1))
    return gates


def _on_failure(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    if sender is None or not task_id:
        return
    gates = _active_gates(task_id)
    request = getattr(sender, "request", None)
    if not gates and request is not None and request.id == task_id:
        gates = _gates_of(request)  # in the process that ran the body
    release_by_id(sender, task_id, gates)


def _on_cold_shutdown(sender: Any = None, request: Any = None, einfo: Any = None, **_: Any) -> None:
    if einfo is None and request is not None:  # only cold shutdown sends a retry without einfo
        release_by_id(sender, request.id, _gates_of(request))


task_received.connect(_decide_gates, weak=False)
task_revoked.connect(_on_revoked, weak=False)
task_failure.connect(_on_failure, weak=False)
task_retry.connect(_on_cold_shutdown, weak=False)


def _active_gates(task_id: str) -> list[Gate]:
    for request in list(worker_state.active_requests):
        if request.id == task_id:
            return _gates_of(request)
    return []


# -- the heartbeat ----------------------------------------------------------------------------


def renew_interval(app: Any) -> float:
    """The shortest renewal interval any task of ``app`` asks for (per-task
    ``semaphore_lease_timeout`` / ``semaphore_heartbeat_interval`` included)."""
    intervals = [get_config(app).renew_every]
    for task in list(app.tasks.values()):
        if getattr(type(task), "semaphore_options", None):
            intervals.append(task_config(task).renew_every)
    return min(intervals)


class Heartbeat:
    """Renews the leases of every running limited task of this worker: one
    ``renew_many`` call per semaphore per interval, from one thread.

    A holder the renewal reports lost is reported (log, :data:`.signals.permit_lost`)
    only if its task has run longer than it can take to acquire, because a
    running request may not have taken its permit yet.

    On warm shutdown it keeps renewing until no task of this worker runs: the
    pool drains after this bootstep is stopped or before, depending on the
    boot order Celery picks (``stop(drain=True)``).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = get_config(app)
        self.interval = renew_interval(app)
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="celery-semaphore-heartbeat", daemon=True
        )
        self._reported: set[tuple[str, str]] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, drain: bool = False) -> None:
        """Stop now, or with ``drain`` once no task of this worker runs any more
        (the thread is a daemon: a worker that exits first ends it too)."""
        if drain:
            self._draining.set()
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._draining.is_set() and not self._running():
                return
            try:
                self.beat()
            except Exception:  # the heartbeat must survive anything; the lease is the backstop
                logger.exception("semaphore heartbeat failed")

    def _running(self) -> list[Any]:
        for _ in range(5):
            try:
                return list(worker_state.active_requests)
            except RuntimeError:  # changed size during iteration
                continue
        return []

    def beat(self) -> None:
        by_gate: dict[Gate, list[Any]] = defaultdict(list)
        for request in self._running():
            for gate in _gates_of(request):
                by_gate[gate].append(request)
        live = set()
        for gate, requests in by_gate.items():
            task = requests[0].task
            config = task_config(task)
            try:
                lost = semaphores.get(gate, config).renew_many([r.id for r in requests])
            except SemaphoreError as error:
                logger.warning("could not renew leases of %s: %s", gate.name, error)
                continue
            for request in requests:
                live.add((gate.name, request.id))
                if request.id in lost:
                    self._lost(gate, request, config.max_block)
        self._reported &= live

    def _lost(self, gate: Gate, request: Any, max_block: float) -> None:
        started = getattr(request, "time_start", None)  # epoch seconds (Request.on_accepted)
        if not started or time.time() - started < max_block + 2.0:
            return
        if (gate.name, request.id) in self._reported:
            return
        self._reported.add((gate.name, request.id))
        logger.error(
            "permit of %s[%s] on semaphore %s is lost (lease ran out or Redis lost data)",
            request.task.name,
            request.id,
            gate.name,
        )
        signals.permit_lost.send(
            sender=request.task,
            semaphore=gate.name,
            task_id=request.id,
            task_name=request.task.name,
            hostname=request.hostname,
        )


# -- the bootstep -----------------------------------------------------------------------------


class SemaphoreStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: heartbeat thread; with queue caps, admission for every task class.

    Celery may order it before or after the Pool step, so on warm shutdown
    (``stop``) the heartbeat keeps renewing until the pool has drained: leases
    outlive the last task. On cold shutdown (``terminate``) it stops at once;
    the terminated children release in ``finally``, the main process by id.
    """

    label = "celery-semaphore"
    requires = ("celery.worker.components:Timer",)

    def __init__(
        self, worker: Any, semaphore_metrics_port: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(worker, **kwargs)
        self.heartbeat: Heartbeat | None = None
        self.metrics_port = semaphore_metrics_port
        self.metrics_server: Any = None
        if worker.app.conf.get("semaphore_send_events") is None:
            worker.app.conf.semaphore_send_events = bool(getattr(worker, "task_events", False))
            forget_config(worker.app)
        if get_config(worker.app).queue_limits:
            admit_every_task(worker.app)

    def start(self, worker: Any) -> None:
        self.heartbeat = Heartbeat(worker.app)
        self.heartbeat.start()
        if self.metrics_port:
            config = get_config(worker.app)
            client = connect(config.redis_url)[0]
            self.metrics_server = metrics.serve(
                client, config.namespace, self.metrics_port, mask_url(config.redis_url)
            )
            logger.info("celery-semaphore metrics on port %s", self.metrics_port)

    def stop(self, worker: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop(drain=True)
            self.heartbeat = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def terminate(self, worker: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.stop(worker)

    shutdown = stop
