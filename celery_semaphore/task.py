"""The Celery task base class: ``@app.task(base=LimitedTask, semaphore=..., limit=...)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, ClassVar

import click
from celery import Task

from .admission import admitted_call
from .config import APP_WIDE, PREFIX, SemaphoreConfig, task_config
from .formats import PARK_MARK
from .limits import Concurrency, Declared, Rate, declared
from .patching import PATCHED
from .publish import ParkingProducer, drop_unsent, is_new
from .retry import home_queue, with_waits_added
from .wiring import install

TASK_OPTIONS = sorted(f.name for f in fields(SemaphoreConfig) if f.name not in APP_WIDE)


class LimitedTask(Task):  # type: ignore[misc]
    """At most ``limit`` executions at once across every worker, started in FIFO order.

    Options (decorator keywords):

    - ``semaphore``: the semaphore's name (tasks sharing a name share the cap),
      or a function of the task's arguments returning it (per-key caps:
      ``semaphore=lambda customer_id, **_: f"customer-{customer_id}"``; wrap it
      in ``per_key("customer", ...)`` to name the family the metrics show its
      semaphores as);
    - ``limit``: the cap, an int from 1 to 1,000,000;
    - ``rate``: how fast tasks may start on that semaphore, cluster-wide, in
      Celery's rate syntax (``"20/s"``, ``"100/m"``, ``"1000/h"``); with ``limit``,
      both are granted in one step (give ``limit``, ``rate`` or both);
    - ``weight``: the permits one task takes (and the rate's starts it counts as),
      an int or a function of the task's arguments (default 1);
    - ``fair_by``: a function of the task's arguments naming its account (tenant,
      customer): waiting tasks are served in turns between the accounts that have
      tasks waiting, in order within each (``fair_by=lambda account, **_: account``);
      ``fair_weights``: a mapping of account to weight, or a function of the account
      (an account of weight 3 gets three turns for every one of weight 1);
      ``max_per_key``: the most permits one account holds at once (taken first, on a
      semaphore per account, ``<semaphore>:account:<account>``);
    - ``limits``: instead of the options above, a list of
      [Concurrency][celery_semaphore.Concurrency] and
      [Rate][celery_semaphore.Rate] limits, each on a semaphore of its own or a
      shared one (`celery_semaphore.limits`);
    - ``semaphore_<setting>``: this task's value of a ``semaphore_*`` setting,
      all but the app-wide Redis URL, namespace, queue limits, events and
      per-key metrics (see
      [SemaphoreConfig][celery_semaphore.config.SemaphoreConfig]).

    The permit is taken in the worker right before the body runs and given
    back when it ends, however it ends. Calling the task directly bypasses the
    semaphore; eager execution takes the permit or fails at once.
    """

    semaphore: ClassVar[str | Callable[..., str] | None] = None
    limit: ClassVar[int | None] = None
    rate: ClassVar[str | None] = None
    weight: ClassVar[int | Callable[..., int] | None] = None
    fair_by: ClassVar[Callable[..., Any] | None] = None
    fair_weights: ClassVar[Mapping[str, int] | Callable[[str], int] | None] = None
    max_per_key: ClassVar[int | None] = None
    limits: ClassVar[list[Concurrency | Rate] | None] = None
    semaphore_options: ClassVar[dict[str, Any]] = {}
    #: The limits above, checked once (`celery_semaphore.limits.declared`).
    declared_limits: ClassVar[list[Declared]] = []

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        try:
            cls.declared_limits = declared(cls)
            cls.semaphore_options = cls._checked_options()
        except (TypeError, ValueError) as error:
            raise declaration_error(error) from None
        install(app)

    @classmethod
    def _checked_options(cls) -> dict[str, Any]:
        """The task's ``semaphore_*`` options; TypeError / ValueError naming the task."""
        name = f"task {cls.name}"
        options = {}
        for attribute in dir(cls):
            if attribute.startswith(PREFIX) and attribute != "semaphore_options":
                option = attribute[len(PREFIX) :]
                if option not in TASK_OPTIONS:
                    raise ValueError(
                        f"{name}: unknown option {attribute}; accepted: semaphore, limit, "
                        "rate, weight, fair_by, fair_weights, max_per_key, limits, "
                        + ", ".join(PREFIX + o for o in TASK_OPTIONS)
                    )
                options[option] = getattr(cls, attribute)
        for option in TASK_OPTIONS:
            if option in cls.__dict__:
                raise ValueError(f"{name}: unknown option {option}; did you mean {PREFIX}{option}?")
        try:
            SemaphoreConfig(**options)  # type and range checks now; app settings join at first use
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {PREFIX}{error}") from None
        return options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return admitted_call(self, super().__call__, args, kwargs)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: Any = None, producer: Any = None,
        **options: Any,
    ) -> Any:  # fmt: skip
        """As Celery's; in handover mode a new task far back in line is parked at
        once instead of sent (`celery_semaphore.publish.ParkingProducer`). If the
        publish raises (the broker is down), the places it took are given back."""
        try:
            if not may_park(self, options):
                return super().apply_async(args, kwargs, task_id, producer, **options)
            options["headers"] = {**(options.get("headers") or {}), PARK_MARK: True}
            with self.app.producer_or_acquire(producer) as real:
                parking = ParkingProducer(real, self)
                return super().apply_async(args, kwargs, task_id, parking, **options)
        except Exception:
            drop_unsent()
            raise

    def signature_from_request(
        self,
        request: Any = None,
        args: Any = None,
        kwargs: Any = None,
        queue: Any = None,
        **extra_options: Any,
    ) -> Any:
        request = self.request if request is None else request
        return super().signature_from_request(
            request,
            args,
            kwargs,
            queue or home_queue(request),
            **with_waits_added(request, extra_options),
        )


class DeclarationValueError(ValueError, click.ClickException):
    """A LimitedTask declared with a bad value. Also a ClickException, so that
    ``celery worker`` (which binds the tasks while it starts) prints it as one
    line and exits 1, rather than a long traceback ending with it."""

    def __init__(self, message: str) -> None:
        click.ClickException.__init__(self, message)


class DeclarationTypeError(TypeError, click.ClickException):
    """A LimitedTask declared with a value of the wrong type (see above)."""

    def __init__(self, message: str) -> None:
        click.ClickException.__init__(self, message)


def declaration_error(error: TypeError | ValueError) -> Exception:
    kind = DeclarationTypeError if isinstance(error, TypeError) else DeclarationValueError
    return kind(str(error))


setattr(LimitedTask, PATCHED, True)  # queue caps: admission is built in, nothing to patch


def may_park(task: LimitedTask, options: dict[str, Any]) -> bool:
    """Whether ``task.apply_async(**options)`` may park the message it publishes:
    a new task (no ETA, not a retry), in handover mode, sent by a producer we
    can wrap (not eager, no ``connection`` of the caller's). Reads the task's settings
    first: every publish of a limited task passes here, and an app whose semaphores
    have no Redis to share refuses the first (`celery_semaphore.config.check_shared_redis`)."""
    if not task_config(task).parks:
        return False
    if options.get("eta") or options.get("countdown") or "retries" in options:
        return False
    if "connection" in options or "publisher" in options or task.app.conf.task_always_eager:
        return False
    return is_new(options.get("headers") or {})
