"""The start-up check of the Celery internals the plugin relies on."""

from __future__ import annotations

from types import SimpleNamespace

import click
import pytest
from celery import Celery
from celery.worker.request import Request

import celery_semaphore
from celery_semaphore.worker import internals
from celery_semaphore.worker.bootstep import SemaphoreStep


def test_the_installed_celery_has_every_internal_the_plugin_uses() -> None:
    assert internals.missing() == []


def test_a_missing_internal_is_named_with_what_it_is_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Request, "request_dict")
    assert internals.missing() == [
        "celery.worker.request.Request.request_dict (the gates and queue decided when a "
        "message arrives reach the task's process in it)"
    ]


def test_the_worker_refuses_to_start_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("internals", broker="redis://127.0.0.1:1/0", set_as_current=False)
    worker = SimpleNamespace(app=app, task_events=False)
    step = SemaphoreStep(worker)
    monkeypatch.delattr(Request, "request_dict")
    with pytest.raises(click.ClickException, match=r"^celery-semaphore: this Celery \(5\.") as info:
        step.create(worker)
    assert "Request.request_dict" in info.value.message
    assert "\n" not in info.value.message
    celery_semaphore.reset(app)
    app.close()
