"""Kept permits (`SemaphoreModel.keep`): a task's process keeps its permit for its next
task only while nobody waits; the first waiter of an empty line publishes a recall. Each
scenario drives a store and the model together (`Pair`) and asserts its rule outright."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conformance_driver import Pair

from celery_semaphore import Permit, Place, RateLimit

MakePair = Callable[..., Pair]

KEPT_AS = "kept|worker-1|4242|sem"


def holders_of(p: Pair) -> dict[str, str]:
    return {h.holder: h.info for h in p.sem.status().holders}


def test_a_permit_nobody_waits_for_is_kept_as_the_process_holder(pair: MakePair) -> None:
    p = pair(2)
    permit = p.attempt("task-1")
    assert isinstance(permit, Permit)
    kept = p.keep_permit(0, KEPT_AS, "kept by worker-1")
    assert kept is not None and kept.fencing_token == permit.fencing_token
    assert holders_of(p) == {KEPT_AS: "kept by worker-1"}, "task-1 holds nothing now"
    p.check()
    assert p.renew_permit(1), "the keeper renews it like any permit"
    assert not p.release_permit(0), "task-1's own permit is gone: releasing it does nothing"
    assert isinstance(p.attempt("task-2"), Permit)
    assert isinstance(p.attempt("task-3"), Place), "a kept permit counts against the limit"
    assert p.release_permit(1), "the keeper gives it back with its token"
    p.check()
    p.check_counters()


def test_a_permit_is_released_not_kept_while_anyone_waits(pair: MakePair) -> None:
    p = pair(1)
    p.attempt("a")
    assert isinstance(p.attempt("b"), Place)
    assert p.keep_permit(0, KEPT_AS) is None, "b waits: the permit goes back"
    assert isinstance(p.attempt("b"), Permit)
    p.check()
    p.check_counters()


@pytest.mark.parametrize("why", ["draining", "limit lowered", "rate", "shadow limit"])
def test_no_permit_is_kept_where_keeping_would_cost_something(pair: MakePair, why: str) -> None:
    options: dict[str, Any] = {
        "rate": {"rate": RateLimit(2, 60.0, burst=2)},  # slow: no clock in the way
        "shadow limit": {"shadow": frozenset({"limit"})},
    }.get(why, {})
    p = pair(2, **options)
    p.attempt("a")
    p.attempt("b")
    if why == "draining":
        p.set_draining(True)
    elif why == "limit lowered":
        p.set_limit(1)
    assert p.keep_permit(0, KEPT_AS) is None, why
    assert KEPT_AS not in holders_of(p)
    p.check()
    p.check_counters()


def test_a_holder_keeps_one_permit_per_name(pair: MakePair) -> None:
    p = pair(3)
    p.attempt("a")
    p.attempt("b")
    assert p.keep_permit(0, KEPT_AS) is not None
    assert p.keep_permit(1, KEPT_AS) is None, "that name keeps one already: b's goes back"
    assert sorted(holders_of(p)) == [KEPT_AS]
    p.check()


def test_a_weighted_permit_is_kept_whole(pair: MakePair) -> None:
    p = pair(3)
    p.attempt("a", weight=2)
    assert p.keep_permit(0, KEPT_AS) is not None
    assert isinstance(p.attempt("b"), Permit)
    assert isinstance(p.attempt("c"), Place), "the kept permit still holds two"
    p.check()
    p.check_counters()


def test_the_first_waiter_of_an_empty_line_publishes_a_recall(listening: MakePair) -> None:
    p = listening(1)
    p.attempt("a")
    assert p.keep_permit(0, KEPT_AS) is not None
    assert isinstance(p.attempt("b"), Place)
    assert p.last_heard == ["k"], "a line formed: the keepers are told"
    assert isinstance(p.attempt("c"), Place)
    assert p.last_heard == [], "only the first waiter of a line publishes"
    assert p.release_permit(1), "the keeper gives the permit back"
    assert isinstance(p.attempt("b"), Permit)
    p.check()


def test_a_place_taken_at_publish_in_an_empty_line_publishes_a_recall(
    listening: MakePair,
) -> None:
    p = listening(1)
    p.attempt("a")
    p.take_place("b")
    assert p.last_heard == ["k"]
    p.check()


@pytest.mark.parametrize("change", ["limit", "drain"])
def test_an_operators_change_publishes_a_recall(listening: MakePair, change: str) -> None:
    p = listening(2)
    p.attempt("a")
    assert p.keep_permit(0, KEPT_AS) is not None
    if change == "limit":
        p.set_limit(1)
    else:
        p.set_draining(True)
    assert p.last_heard[:1] == ["k"], "kept permits would start tasks past the change"
    p.check()
