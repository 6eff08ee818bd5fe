"""Fast unit tests of the pure code: no redis-server, no network, a few seconds in all.

Every test here runs with socket connects refused (:func:`_no_network`), so a
test that would reach a Redis (or anything else) fails at once instead of
passing by luck on a machine that has one. Building a redis-py client from a
URL does not connect, and the Celery apps use the in-memory broker.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore.state import installed_apps, reset


class NetworkUsedError(AssertionError):
    """A unit test tried to open a connection."""


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any, *args: Any) -> Any:
        self.close()  # the caller expects OSError, not this, and would leak the socket
        raise NetworkUsedError(f"a unit test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


MakeApp = Callable[..., Celery]


@pytest.fixture
def make_app() -> Iterator[MakeApp]:
    """Fresh Celery apps on the in-memory broker; ``make_app(**conf)`` sets settings."""
    made: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = Celery(f"unit{len(made)}", broker="memory://", set_as_current=False)
        app.conf.update(conf)
        made.append(app)
        return app

    yield make
    for app in made:
        reset(app)
        installed_apps.discard(app)
        app.close()
