"""The Celery internals the plugin relies on, checked once when a worker starts.

They are not Celery's public API. A release that renamed one would not fail
loudly on its own: a guarantee would quietly vanish (the gates decided when a
message arrives would not reach the child, so a queue cap would stop capping;
the heartbeat would renew nothing and leases would run out under running
tasks). `missing()` lists what is gone and what it is for; the worker
bootstep refuses to start (one line, exit 1) when the list is not empty.
"""

from __future__ import annotations

import importlib

# (module, attribute path, what the plugin uses it for)
REQUIRED = (
    ("celery.worker.request", "Request.request_dict",
     "the gates and queue decided when a message arrives reach the task's process in it"),
    ("celery.worker.request", "Request.worker_pid",
     "a killed pool child's permits are released at once"),
    ("celery.worker.request", "Request.time_start", "the heartbeat tells executions apart"),
    ("celery.worker.state", "active_requests", "the heartbeat renews the running tasks' leases"),
    ("celery.worker.state", "revoked", "revoked parked tasks leave the line"),
    ("celery.worker.consumer.consumer", "Consumer.add_task_queue",
     "workers consume the handover queues"),
    ("celery.app.task", "Task.signature_from_request", "a waiting task is sent again with it"),
)  # fmt: skip


def missing() -> list[str]:
    """``module.attribute: what it is for``, for every internal this Celery lacks."""
    gone = []
    for module_name, path, purpose in REQUIRED:
        try:
            value: object = importlib.import_module(module_name)
            for part in path.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError):
            gone.append(f"{module_name}.{path} ({purpose})")
    return gone
