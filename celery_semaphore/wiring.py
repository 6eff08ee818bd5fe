"""Wiring the plugin into Celery: `install()`, called when the plugin is first used.

Importing `celery_semaphore` connects nothing. The Celery side wires
itself when it is used: a `LimitedTask` bound to an
app calls `install()`; an app that only uses ``semaphore_queue_limits``
calls it itself. Installing adds the worker bootstep and its command-line
option to the app and connects the package's signal handlers (once per
process, whatever the number of apps).
"""

from __future__ import annotations

import threading
from typing import Any

from celery.bin.worker import worker as celery_worker_command
from celery.signals import (
    after_task_publish,
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    task_received,
    task_retry,
    task_revoked,
    worker_process_init,
    worker_process_shutdown,
)

from . import events, kept_permits
from .publish import confirm_sent, take_places
from .state import installed_apps
from .worker import pool_occupancy, release
from .worker.bootstep import WORKER_OPTIONS, SemaphoreStep
from .worker.handover_queues import HandoverQueues
from .worker.received import decide_gates

_connected = threading.Event()
_lock = threading.Lock()


def _connect_handlers() -> None:
    with _lock:
        if _connected.is_set():
            return
        before_task_publish.connect(take_places, weak=False)
        after_task_publish.connect(confirm_sent, weak=False)
        task_received.connect(decide_gates, weak=False)
        task_revoked.connect(release.on_revoked, weak=False)
        task_failure.connect(release.on_failure, weak=False)
        task_retry.connect(release.on_cold_shutdown, weak=False)
        task_prerun.connect(pool_occupancy.on_task_start, weak=False)
        task_postrun.connect(pool_occupancy.on_task_end, weak=False)
        worker_process_init.connect(pool_occupancy.on_process_start, weak=False)
        worker_process_shutdown.connect(pool_occupancy.on_process_end, weak=False)
        worker_process_shutdown.connect(kept_permits.on_process_end, weak=False)
        events.connect()
        _connected.set()


def install(app: Any) -> None:
    """Enable the plugin on ``app``: the worker bootstep (heartbeat, release on
    every ending, metrics), ``celery worker --semaphore-metrics-port`` (also
    added by the ``celery`` command line itself when it loads the plugin), places
    in line at publish. `LimitedTask` does this itself;
    call it when only ``semaphore_queue_limits`` is used. Idempotent."""
    _connect_handlers()
    app.steps["worker"].add(SemaphoreStep)
    app.steps["consumer"].add(HandoverQueues)
    for option in WORKER_OPTIONS:  # when the command line did not load the entry point
        if option.name not in {param.name for param in celery_worker_command.params}:
            app.user_options["worker"].add(option)
    installed_apps.add(app)
