"""Queue caps for tasks of any class: admission installed on each task class at worker start.

Per-queue caps (``semaphore_queue_limits``) apply to every task consumed from
a capped queue, including plain ``@app.task`` functions, so the worker wraps
``__call__`` and ``signature_from_request`` of every registered task class
that is not already a `LimitedTask`. This runs in the
bootstep's constructor: before the pool forks, before tracers are built.
Celery's own tasks (``celery.*``) are left alone.
"""

from __future__ import annotations

import functools
from typing import Any

from .admission import admitted_call
from .retry import home_queue, with_waits_added

PATCHED = "_celery_semaphore_admission"


def admit_every_task(app: Any) -> None:
    for name, task in list(app.tasks.items()):
        if not name.startswith("celery.") and not getattr(type(task), PATCHED, False):
            _patch(type(task))


def _patch(cls: type) -> None:
    original_call = cls.__call__
    original_signature = cls.signature_from_request  # type: ignore[attr-defined]

    @functools.wraps(original_call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return admitted_call(self, functools.partial(original_call, self), args, kwargs)

    @functools.wraps(original_signature)
    def signature_from_request(
        self: Any,
        request: Any = None,
        args: Any = None,
        kwargs: Any = None,
        queue: Any = None,
        **extra: Any,
    ) -> Any:
        request = self.request if request is None else request
        return original_signature(
            self, request, args, kwargs, queue or home_queue(request),
            **with_waits_added(request, extra),
        )  # fmt: skip

    cls.__call__ = __call__  # type: ignore[method-assign]
    cls.signature_from_request = signature_from_request  # type: ignore[attr-defined]
    setattr(cls, PATCHED, True)
