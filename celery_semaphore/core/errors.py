"""The package's one exception tree.

Every error raised by celery-semaphore on purpose is a `SemaphoreError`.
Argument validation raises the built-in `ValueError` / `TypeError`
(as Python APIs do), with messages naming the argument and what is accepted.

A task's exception travels to the caller through the result backend, rebuilt
as ``cls(*exc.args)`` (pickle and Celery's JSON form alike), so each error
keeps its constructor arguments in ``args`` and builds its message in
``__str__``: ``result.get()`` raises the same class, with the same message.
"""

from __future__ import annotations

from typing import Any


class SemaphoreError(Exception):
    """Base class of every error this package raises on purpose."""

    _message: str | None = None

    def _set(self, message: str, *args: Any) -> None:
        """Keep the constructor's arguments in ``args`` (for rebuilding) and the message."""
        super().__init__(message)
        self.args = args
        self._message = message

    def __str__(self) -> str:
        return self._message if self._message is not None else super().__str__()

    def __repr__(self) -> str:
        # what Flower and the task-retried/failed events show (``safe_repr(exc)``)
        return f"{type(self).__name__}({str(self)!r})"


class SemaphoreTimeout(SemaphoreError, TimeoutError):
    """No permit was granted within the allowed wait."""

    def __init__(self, name: str, limit: int, waited: float, detail: str = "") -> None:
        self.name = name
        self.limit = limit
        self.waited = waited
        message = (
            f"no permit of semaphore {name!r} (limit {limit}) was granted "
            f"after waiting {waited:.1f}s"
        )
        self._set(f"{message}: {detail}" if detail else message, name, limit, waited, detail)


_WAIT_REASONS = {
    "": "",
    "rate": ", for its rate's slot",
    "paused": ", its rate paused (RateLimited)",
}


class WaitingForPermit(SemaphoreError):
    """Why a task is in RETRY: it waits for a permit (not a failure).

    The exception of the ``Retry`` a waiting task ends with, so Flower, the
    ``task-retried`` event and the result backend name the semaphore and the
    task's place in line instead of ``None``. ``position`` is 1 for the first
    in line, 0 when the task holds no place (it will ask again later). ``why``:
    ``"rate"`` when the semaphore's rate is what it waits for (its slot), ``"paused"``
    while a task's `RateLimited` pauses that rate, else ``""``.
    """

    def __init__(self, name: str, position: int, waits: int, why: str = "") -> None:
        self.name = name
        self.position = position
        self.waits = waits
        self.why = why
        place = f"place {position} in line" if position else "no place in line yet"
        place += _WAIT_REASONS[why]
        self._set(
            f"waiting for a permit of semaphore {name!r}: {place} (wait {waits})",
            name,
            position,
            waits,
            *([why] if why else []),
        )


class SemaphoreConnectionError(SemaphoreError, ConnectionError):
    """The store (Redis, PostgreSQL) could not be reached, or refused the credentials."""

    def __init__(
        self, url: str, cause: BaseException | str, hint: str | None = None, store: str = "Redis"
    ) -> None:
        self.url = url
        if hint is None:
            hint = f"check that {store} runs there and the URL is right"
            if "auth" in type(cause).__name__.lower() or "WRONGPASS" in str(cause):
                hint = "the server refused the credentials: put the right user/password in the URL"
        self._set(f"{store} at {url} failed: {cause} ({hint})", url, str(cause), hint, store)


class SemaphoreBackendError(SemaphoreError):
    """The store answered, but with an error the semaphore cannot work around."""


class SemaphoreKeyTypeError(SemaphoreBackendError):
    """A key the semaphore owns holds a value of the wrong Redis type."""

    def __init__(self, key: str, actual: str, expected: str) -> None:
        self.key = key
        self.actual = actual
        self.expected = expected
        self._set(
            f"Redis key {key!r} holds a {actual}, but the semaphore keeps a {expected} there: "
            "another program writes to this key; delete it or choose another namespace",
            key,
            actual,
            expected,
        )


class UnknownSemaphore(SemaphoreError, LookupError):
    """No semaphore of that name has been used (or it expired while idle)."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self._set(
            f"no semaphore named {name!r} in namespace {namespace!r} "
            "(it was never used, or expired while idle): check the name and semaphore_namespace",
            name,
            namespace,
        )


class StaleHandover(SemaphoreError):
    """An older copy of a handed-over waiter arrived: a newer copy was handed over
    (its first publisher was presumed dead) or the waiter was served already.
    Drop this copy; the current one is ``token``."""

    def __init__(self, name: str, token: int) -> None:
        self.name = name
        self.token = token
        self._set(
            f"a stale copy of a waiter handed over by semaphore {name!r} arrived "
            f"(the current handover is {token}): drop it",
            name,
            token,
        )
