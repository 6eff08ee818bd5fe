"""Waiting in place and the wake messages: a store's semaphore and the model, with the
driver listening on the store's wake channel; every call's messages are compared with
what the model published (`Pair.heard`). Each scenario also asserts its rule outright.
(The memory store's messages are the model's own, with no channel to listen to:
skipped; tests/unit/test_memory_store.py shows a grant in place there.)"""

from __future__ import annotations

import time
from collections.abc import Callable

from conformance_driver import Pair

from celery_semaphore import Permit, Place

MakePair = Callable[..., Pair]


def holders_of(p: Pair) -> list[str]:
    return sorted(h.holder for h in p.sem.status().holders)


def test_a_release_grants_the_waiter_in_place_its_permit(listening: MakePair) -> None:
    p = listening(1)
    p.attempt("a")
    place = p.attempt("b", in_place=True, lease=30.0)
    assert isinstance(place, Place)
    p.check()  # b shows as waiting in place
    assert [w.state for w in p.sem.status().waiters] == ["waiting in place"]
    assert p.release("a")
    assert [m.split("|")[:2] for m in p.last_heard] == [["g", "b"]], p.last_heard
    assert holders_of(p) == ["b"], "b holds the permit without asking again"
    p.check()
    assert isinstance(p.attempt("b"), Permit), "asking again: a live holder, a new token"
    p.check()


def test_grants_in_place_stop_at_the_first_waiter_not_in_place(listening: MakePair) -> None:
    p = listening(2)
    p.attempt("a")
    p.attempt("b")
    p.attempt("c", in_place=True)
    p.attempt("d")
    p.attempt("e", in_place=True)
    p.release("a")
    assert [m.split("|")[1] for m in p.last_heard] == ["c"], "c is granted, nobody woken"
    p.release("b")
    assert len(p.last_heard) == 1 and not p.last_heard[0].startswith("g|"), (
        "d heads the line and asks itself: no grant in place behind it, a wake-up instead"
    )
    assert holders_of(p) == ["c"]
    p.check()
    assert isinstance(p.attempt("e", in_place=True), Place), "e stays behind d"
    assert isinstance(p.attempt("d"), Permit)
    p.check()


def test_asking_without_waiting_in_place_clears_the_mark(listening: MakePair) -> None:
    p = listening(1)
    p.attempt("a")
    p.attempt("b", in_place=True)
    p.attempt("b")  # its last ask before giving up
    p.check()
    assert [w.state for w in p.sem.status().waiters] == ["asking"]
    p.release("a")
    assert holders_of(p) == [], "b is woken, not granted"
    assert p.last_heard and not p.last_heard[0].startswith("g|")
    p.check()


def test_a_wake_up_names_the_highest_admissible_ticket(listening: MakePair) -> None:
    p = listening(2)
    p.attempt("a")
    p.attempt("b")
    places = [p.attempt(h) for h in "cde"]
    p.release("a")
    c_ticket = places[0].ticket if isinstance(places[0], Place) else 0
    assert p.last_heard == [str(c_ticket)], "one free permit: up to c"
    p.set_limit(4)  # three free: up to e (after the recall of kept permits every change sends)
    e_ticket = places[2].ticket if isinstance(places[2], Place) else 0
    assert p.last_heard == ["k", str(e_ticket)]
    p.set_limit(10)  # more free than wait: anyone
    assert p.last_heard == ["k", "inf"]
    p.check()


def test_nothing_is_granted_in_place_while_draining(listening: MakePair) -> None:
    p = listening(1)
    p.attempt("a")
    p.attempt("b", in_place=True)
    p.set_draining(True)
    p.release("a")
    assert p.last_heard == [] and holders_of(p) == []
    p.set_draining(False)  # an ended drain follows freed capacity: b is granted
    assert holders_of(p) == ["b"]
    p.check()


def test_a_heavy_waiter_in_place_waits_for_all_its_permits(listening: MakePair) -> None:
    p = listening(3)
    p.attempt("a", weight=2)
    p.attempt("b")
    p.attempt("c", weight=3, in_place=True)
    p.attempt("d", in_place=True)
    p.release("b")
    assert p.last_heard == [], "c needs three, one is free: nothing moves (d is behind c)"
    p.release("a")
    assert [m.split("|")[1] for m in p.last_heard] == ["c"]
    p.check()


def test_a_lease_that_ran_out_grants_in_place_at_the_next_call(listening: MakePair) -> None:
    p = listening(1)
    p.attempt("a", lease=0.3)
    p.attempt("b", in_place=True)
    p.attempt("c")
    time.sleep(0.5)
    assert isinstance(p.attempt("c"), Place), "the reclaim grants b first: it is ahead"
    assert [m.split("|")[1] for m in p.last_heard] == ["b"]
    p.check()
