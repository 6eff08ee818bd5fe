"""A parked task's message: serialized with the app's serializer, brought back intact."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

import celery_semaphore
from celery_semaphore.handover import TooLarge, decode, encode


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("payload", broker="memory://", set_as_current=False)
    yield app
    celery_semaphore.reset(app)
    app.close()


def test_a_signature_comes_back_as_it_was_parked(app: Celery) -> None:
    signature = app.signature(
        "proj.job", args=(1, "two"), kwargs={"three": [3]},
        options={"queue": "q.semaphore-handover", "headers": {"h": 1}, "task_id": "t-1"},
    )  # fmt: skip
    back = decode(app, encode(app, signature, 10_000))
    assert (back.task, list(back.args), back.kwargs) == ("proj.job", [1, "two"], {"three": [3]})
    assert back.options["queue"] == "q.semaphore-handover"
    assert back.options["headers"] == {"h": 1}
    assert back.options["task_id"] == "t-1"


def test_the_app_serializer_is_used_and_accept_content_honoured(app: Celery) -> None:
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    payload = encode(app, app.signature("proj.job", args=({1, 2},)), 10_000)
    assert decode(app, payload).args == ({1, 2},)
    app.conf.accept_content = ["json"]
    with pytest.raises(Exception, match="pickle"):
        decode(app, payload)


def test_a_message_over_the_limit_is_not_parked(app: Celery) -> None:
    with pytest.raises(TooLarge, match="over 100"):
        encode(app, app.signature("proj.job", args=("x" * 500,)), 100)
