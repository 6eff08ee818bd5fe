"""The ``permit_released`` signal after a task's end with keeping on: sent when the
store released the permit (or found it lost), never when the process kept it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_semaphore import admission, signals
from celery_semaphore.formats import Gate


class FakeAdmission:
    def __init__(self) -> None:
        self.gates = [Gate("s", 2)]
        self.permits = {self.gates[0]: object()}
        self.request = SimpleNamespace(hostname="w1")
        self.config = None
        self.sent: list[tuple[Any, dict[str, Any]]] = []

    def _sem(self, gate: Gate) -> Any:
        return object()

    def _send(self, signal: Any, gate: Gate, **fields: Any) -> None:
        self.sent.append((signal, fields))

    def exit(self) -> None:
        raise AssertionError("the permit is handed to the keeper, not released here")


@pytest.mark.parametrize(
    ("outcome", "sent"),
    [("kept", []), ("released", [{"released": True}]), ("lost", [{"released": False}]),
     (None, [])],
)  # fmt: skip
def test_permit_released_only_when_the_store_released_or_lost_it(
    outcome: str | None, sent: list[dict[str, Any]]
) -> None:
    fake = FakeAdmission()
    keeper = SimpleNamespace(keep=lambda *args: outcome)
    admission._keep_or_exit(fake, keeper)  # type: ignore[arg-type]
    assert [fields for signal, fields in fake.sent if signal is signals.permit_released] == sent
    assert fake.permits == {}, "the permit left the admission either way"
