"""The wire formats: a parked task's payload (serialized with the app's serializer,
brought back intact, versioned) and the wait state in the headers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery

import celery_semaphore
from celery_semaphore.formats import (
    WAIT_HEADER,
    ParkedMessage,
    PayloadVersionError,
    TooLarge,
    WaitState,
    decode_payload,
    encode_message,
    encode_signature,
    with_handover,
)


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
    back = decode_payload(app, encode_signature(app, signature, 10_000))
    assert (back.task, list(back.args), back.kwargs) == ("proj.job", [1, "two"], {"three": [3]})
    assert back.options["queue"] == "q.semaphore-handover"
    assert back.options["headers"] == {"h": 1}
    assert back.options["task_id"] == "t-1"


def test_the_app_serializer_is_used_and_accept_content_honoured(app: Celery) -> None:
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    payload = encode_signature(app, app.signature("proj.job", args=({1, 2},)), 10_000)
    assert decode_payload(app, payload).args == ({1, 2},)
    app.conf.accept_content = ["json"]
    with pytest.raises(Exception, match="pickle"):
        decode_payload(app, payload)


def test_a_message_over_the_limit_is_not_parked(app: Celery) -> None:
    with pytest.raises(TooLarge, match="over 100"):
        encode_signature(app, app.signature("proj.job", args=("x" * 500,)), 100)


def test_a_payload_carries_its_version_and_older_payloads_still_read(app: Celery) -> None:
    signature = app.signature("proj.job", args=(1,))
    payload = encode_signature(app, signature, 10_000)
    assert json.loads(payload)["v"] == 1
    unversioned = json.dumps(json.loads(payload)["signature"])  # as 0.1.0 parked it
    assert list(decode_payload(app, unversioned).args) == [1]
    message = encode_message(app, ((2,), {}, {}), {"headers": {"id": "t"}}, "work", 10_000)
    old_message = {k: v for k, v in json.loads(message).items() if k != "v"}
    parked = decode_payload(app, json.dumps(old_message))
    assert isinstance(parked, ParkedMessage)
    assert (parked.queue, parked.options["headers"]) == ("work", {"id": "t"})


def test_a_payload_from_a_newer_version_is_refused_by_name(app: Celery) -> None:
    newer = json.dumps({"v": 2, "something": "new"})
    with pytest.raises(PayloadVersionError, match="version 2; this celery-semaphore reads up to"):
        decode_payload(app, newer)


def test_the_wait_state_reads_from_the_request_or_its_headers() -> None:
    state = WaitState({"s": 5}, waits=2, first_ask=1.5, period_start=1)
    header = state.encode()
    assert WaitState.of(SimpleNamespace(**{WAIT_HEADER: header})) == state
    assert WaitState.of(SimpleNamespace(headers={WAIT_HEADER: header})) == state
    assert WaitState.in_headers({WAIT_HEADER: header}) == state
    assert WaitState.of(SimpleNamespace(headers=None)) == WaitState()
    marked = with_handover({WAIT_HEADER: header}, "s", 7)
    assert WaitState.in_headers(marked).handover == ("s", 7)
    assert "handover" not in WaitState.in_headers(marked).encode()  # never written back
    assert not WaitState.in_headers(marked).moved
    moved = with_handover(marked, "s", 8, moved=True)
    assert (WaitState.in_headers(moved).handover, WaitState.in_headers(moved).moved) == (
        ("s", 8),
        True,
    )
    assert "moved" not in WaitState.in_headers(moved).encode()  # never written back
    assert not WaitState.in_headers(with_handover(moved, "s", 9)).moved  # a copy not kept
