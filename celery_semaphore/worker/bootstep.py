"""The worker bootstep: starts and stops the heartbeat, the watch for killed children and the
metrics endpoint."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import click
from celery import __version__ as celery_version
from celery import bootsteps
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.worker import state as worker_state

from celery_semaphore import metrics
from celery_semaphore.config import (
    check_shared_redis,
    get_config,
    task_config,
    url_setting,
    uses_handover,
)
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.core.operations import OperatedStore, operated_store
from celery_semaphore.core.urls import mask_url
from celery_semaphore.gates import warn_disagreeing_limits
from celery_semaphore.kept_permits import give_back_kept
from celery_semaphore.patching import admit_every_task
from celery_semaphore.state import state_of

from . import internals, pool_occupancy
from .dead_children import DeadChildren, reaped_by_signal
from .heartbeat import Heartbeat, child_killed
from .kept_of_children import KeptOfChildren

logger = logging.getLogger(__name__)

METRICS_PORT_OPTION = click.Option(
    ["--semaphore-metrics-port"],
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve celery-semaphore's Prometheus metrics on this port (needs the prometheus extra).",
)
METRICS_ADDRESS_OPTION = click.Option(
    ["--semaphore-metrics-address"],
    default="0.0.0.0",
    show_default=True,
    help="The address --semaphore-metrics-port listens on (127.0.0.1: this host only).",
)
WORKER_OPTIONS = (METRICS_PORT_OPTION, METRICS_ADDRESS_OPTION)


def add_worker_options(command: click.Command) -> None:
    """Give ``celery worker`` the plugin's options (once). Called when Celery's
    command line loads the plugin's ``celery.commands`` entry point, before it
    parses anything, so the options exist whichever way the app installs the
    plugin (a LimitedTask binds only after the command line was parsed)."""
    present = {param.name for param in command.params}
    command.params.extend(o for o in WORKER_OPTIONS if o.name not in present)


def _read(collection: Any) -> list[Any]:
    """The items of one of the worker state's collections, which other threads change."""
    for _ in range(5):
        try:
            return list(collection)
        except RuntimeError:  # changed size during iteration
            continue
    return []


def running_requests() -> list[Any]:
    """The requests this worker runs now."""
    return _read(worker_state.active_requests)


def revoked_ids() -> list[str]:
    """The task ids this worker was told to revoke (kept for a few hours)."""
    return _read(worker_state.revoked)


def check_parking(app: Any) -> None:
    """Where the app's handover tasks park (the broker, or the semaphores' Redis),
    read before the pool forks: the children inherit the reading, and the warning
    (if they may not park) comes once, at start."""
    configs = [get_config(app)]
    configs += [
        task_config(task)
        for task in list(app.tasks.values())
        if getattr(type(task), "semaphore_options", None)
    ]
    state = state_of(app)
    for config in (c for c in configs if c.parks):
        if state.parking.where(app, config, state.semaphores.store(config.redis_url)) is None:
            return


def check_one_process(worker: Any, url: str) -> None:
    """The memory store (``memory://``) holds semaphores in one process: a pool whose
    tasks run in child processes would give each child a store of its own (no cap
    across them). ValueError: say so, and what to use."""
    if not url.startswith("memory://"):
        return
    pool = getattr(worker, "pool_cls", None)
    if isinstance(pool, type) and issubclass(pool, PreforkPool):
        raise ValueError(
            f"semaphore_redis_url {url!r} keeps the semaphores in this process, and the "
            "prefork pool runs tasks in child processes, each with a store of its own: "
            "run this worker with --pool threads (or solo), or give a redis:// URL"
        )


def warn_if_evicting(store: OperatedStore) -> None:
    """A Redis that may evict keys can drop a semaphore's holders: then more tasks run
    than the limit. Every key of a semaphore has an expiry, so a ``volatile-*``
    policy can take them as surely as an ``allkeys-*`` one."""
    policy = store.eviction_policy()
    if policy is not None and policy != "noeviction":
        logger.warning(
            "celery-semaphore: the Redis at %s may evict keys when it reaches maxmemory "
            "(maxmemory-policy %s): an evicted holder set lets more tasks run than the "
            "limit. Set maxmemory-policy noeviction there, or give the semaphores a Redis "
            "of their own (semaphore_redis_url)",
            store.url,
            policy,
        )


def check_reachable(app: Any, config: Any) -> None:
    """Whether the semaphores' Redis answers, read before the pool forks into a flag the
    pool processes share (an answer any of them gets later counts for all). Until it
    has answered once, a limited task that cannot reach it fails with
    `SemaphoreConnectionError` rather than waiting for it (see
    `celery_semaphore.admission`): say so now, once."""
    state = state_of(app)
    try:
        state.semaphores.store(config.redis_url).ping()
    except SemaphoreError as error:
        logger.error(
            "celery-semaphore: the semaphores' store at %s does not answer (%s): until it "
            "does, limited tasks fail with SemaphoreConnectionError; once it has answered, "
            "semaphore_on_redis_error applies. Check %s (or the broker URL)",
            mask_url(config.redis_url),
            error,
            url_setting(app),
        )
        return
    state.redis_answered.set()


def keeps_permits(worker: Any) -> bool:
    """Whether the worker's pool processes may keep permits between tasks: a prefork,
    solo or thread pool (a greenlet pool's tasks share one thread: not yet)."""
    module = getattr(worker.pool_cls, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] in {"prefork", "solo", "thread"}


class SemaphoreStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Heartbeat thread and metrics endpoint; with queue caps, admission for every task class.

    Celery may order it before or after the Pool step, so on warm shutdown
    (``stop``) the heartbeat keeps renewing until the pool has drained: leases
    outlive the last task. On cold shutdown (``terminate``) it stops at once;
    the terminated children release in ``finally``, the main process by id.
    """

    label = "celery-semaphore"

    def __init__(
        self,
        worker: Any,
        semaphore_metrics_port: int | None = None,
        semaphore_metrics_address: str = "0.0.0.0",
        **kwargs: Any,
    ) -> None:
        super().__init__(worker, **kwargs)
        self.heartbeat: Heartbeat | None = None
        self.dead_children: DeadChildren | None = None
        self.metrics_port = semaphore_metrics_port
        self.metrics_address = semaphore_metrics_address
        self.metrics_server: Any = None
        self.kept_of_children: KeptOfChildren | None = None

    def create(self, worker: Any) -> None:
        """Celery calls this for every step before it starts any, so before the pool
        forks: the settings and Celery's internals are checked here (a problem is one
        line and exit 1), whether tasks may park in the semaphores' Redis is read
        (and a warning logged if not), with queue caps every task class gets
        admission, and the count of the pool's busy processes is made (a prefork
        pool inherits it: `pool_occupancy`)."""
        state_of(worker.app).worker_events = bool(getattr(worker, "task_events", False))
        gone = internals.missing()
        if gone:
            raise click.ClickException(
                f"celery-semaphore: this Celery ({celery_version}) lacks what the plugin "
                f"relies on: {'; '.join(gone)}. Use a Celery the plugin supports (5.3 to 5.7)"
            )
        try:
            check_shared_redis(worker.app)
            config = get_config(worker.app)
            check_one_process(worker, config.redis_url)
            if uses_handover(worker.app):
                check_parking(worker.app)
        except (TypeError, ValueError) as error:
            # The worker's command line prints a ClickException as one line and exits 1.
            raise click.ClickException(f"celery-semaphore: {error}") from None
        if config.queue_limits or config.queue_rates:
            admit_every_task(worker.app)
        warn_disagreeing_limits(worker.app)
        check_reachable(worker.app, config)
        pool_occupancy.start_for(worker)
        state_of(worker.app).keeps_permits = keeps_permits(worker)

    def start(self, worker: Any) -> None:
        kept = self.kept_of_children = KeptOfChildren(worker.app, worker.hostname, worker.pool)
        dead_children = self.dead_children = DeadChildren(
            running_requests, reaped=lambda: reaped_by_signal(worker.pool), also=kept.look
        )
        self.heartbeat = Heartbeat(
            worker.app,
            running_requests,
            revoked=revoked_ids,
            hostname=worker.hostname,
            # a killed child's request stays listed until Celery processes its loss
            killed=lambda request: child_killed(request) or dead_children.handled(request),
            released=dead_children.handled,
        )
        self.heartbeat.start()
        dead_children.start()
        config = get_config(worker.app)
        with contextlib.suppress(SemaphoreError):  # check_reachable() said so
            warn_if_evicting(state_of(worker.app).semaphores.store(config.redis_url))
        if self.metrics_port:
            self.metrics_server = self._serve_metrics(config, self.metrics_port)

    def _serve_metrics(self, config: Any, port: int) -> Any:
        """The metrics endpoint, or None (logged at ERROR) if it cannot listen: the
        worker goes on enforcing the caps without it."""
        where = f"{self.metrics_address}:{port}"
        store = operated_store(config.redis_url)
        try:
            server = metrics.serve(
                store,
                config.namespace,
                port,
                addr=self.metrics_address,
                per_key=config.metrics_per_key,
            )
        except OSError as error:
            store.close()
            logger.error(
                "celery-semaphore: no metrics: --semaphore-metrics-port %s cannot listen on "
                "%s (%s); choose a free port, or --semaphore-metrics-address",
                port,
                where,
                error.strerror or error,
            )
            return None
        logger.info("celery-semaphore metrics on %s", where)
        return server

    def stop(self, worker: Any) -> None:
        give_back_kept(worker.app)  # a solo or thread pool's, kept in this process
        if self.dead_children is not None:
            self.dead_children.stop()
            self.dead_children = None
        if self.heartbeat is not None:
            self.heartbeat.stop(drain=True)
            self.heartbeat = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def terminate(self, worker: Any) -> None:
        if self.kept_of_children is not None:
            self.kept_of_children.release_all()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.stop(worker)
