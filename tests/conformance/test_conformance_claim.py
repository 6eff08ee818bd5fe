"""Claim, store against model: the process that got a handover took the head of a
parking queue, whose message may be another waiter's; ``claim(taken, handover)`` says
what to do with it, and gives the turn to a parked waiter's message by a swap. Every
answer is compared (`Pair.claim`), and ``status()`` after each step (the counts of
parked and handed-over waiters among it)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from conformance_driver import Pair

from celery_semaphore import Permit, Place
from celery_semaphore.core import Claimed
from celery_semaphore.core.model import State

MakePair = Callable[..., Pair]
DEADLINE = 0.3  # s: a handover's deadline, where a test waits past it


@pytest.fixture
def publishing(pair: MakePair) -> Callable[..., Pair]:
    """A pair whose semaphore publishes handovers (``on_handover``)."""

    def make(limit: int = 1, **options: object) -> Pair:
        options.setdefault("handover_window", 1.0)
        return pair(limit, **options)

    return make


def parked_behind_a_holder(p: Pair, *waiters: str) -> None:
    """``a`` holds the one permit; ``waiters`` park behind it, in this order."""
    p.attempt("a")
    for waiter in waiters:
        p.park(waiter, f"message of {waiter}")


def test_the_waiters_own_message_is_published_and_nothing_changes(publishing: MakePair) -> None:
    p = publishing(1)
    parked_behind_a_holder(p, "b")
    p.release("a")
    token = p.copies["b"][-1]
    assert p.claim("b", "b", token) is Claimed.PUBLISH
    p.check()
    assert isinstance(p.attempt("b", handover=token), Permit)
    p.check()


def test_a_parked_waiters_message_takes_the_turn_and_the_place_of_the_other(
    publishing: MakePair,
) -> None:
    """The message in hand (d) takes b's turn and, its ticket being the later, b's
    place in line: it is served when it arrives, and b waits in d's place."""
    p = publishing(1)
    parked_behind_a_holder(p, "b", "c", "d")
    p.release("a")
    assert [h.holder for h in p.received] == ["b", "c"], "d is parked still"
    token = p.copies["b"][-1]
    assert p.claim("d", "b", token) is Claimed.PUBLISH, "d's message was at the head"
    p.check()
    states = {w.holder: w.state for w in p.sem.status().waiters}
    assert states == {"b": "parked", "c": "handed over", "d": "handed over"}
    assert p.claim("b", "b", token) is Claimed.VOID, "b's turn went to d"
    assert [w.holder for w in p.sem.status().waiters] == ["d", "c", "b"], "tickets swapped"
    assert p.dispatch() == [], "b waits in d's place, behind c (handed over)"
    p.check()
    assert not isinstance(p.attempt("d", handover=token), Place), "d arrives: served"
    p.check()


def test_after_the_deadline_both_come_back(publishing: MakePair) -> None:
    """The message taken takes the deadline of the handover it took; the waiter that
    gave it up keeps it: both are handed over again then."""
    p = publishing(1, handover_deadline=DEADLINE)
    parked_behind_a_holder(p, "b", "c", "d")
    p.release("a")
    assert p.claim("d", "b", p.copies["b"][-1]) is Claimed.PUBLISH
    time.sleep(DEADLINE + 0.2)
    assert sorted(h.holder for h in p.dispatch()) == ["b", "c", "d"]
    p.check()


def test_a_late_handover_keeps_the_earlier_token_as_its_mark(publishing: MakePair) -> None:
    p = publishing(1, handover_deadline=DEADLINE)
    parked_behind_a_holder(p, "b")
    p.release("a")
    first = p.copies["b"][-1]
    time.sleep(DEADLINE + 0.2)
    assert [h.holder for h in p.dispatch()] == ["b"]
    record = p.model.parking.records["b"]
    assert (record.state, record.mark) == (State.HANDED, p.handover_tokens.to_model[first])
    assert p.claim("b", "b", first) is Claimed.VOID, "the earlier copy's handover is not the latest"
    assert p.claim("b", "b", p.copies["b"][-1]) is Claimed.PUBLISH
    p.check()


def test_a_swap_gives_the_waiter_its_earlier_copys_token_back(publishing: MakePair) -> None:
    """Handed over again after its deadline, b's earlier copy may only be late: when
    the later handover goes to another's message, that earlier copy is b's again."""
    p = publishing(1, handover_deadline=DEADLINE)
    parked_behind_a_holder(p, "b", "c", "d")
    p.release("a")
    first = p.copies["b"][-1]
    time.sleep(DEADLINE + 0.2)
    assert [h.holder for h in p.dispatch()] == ["b", "c"]
    p.check()
    assert (p.sem.status().parked_count, p.sem.status().handed_over_count) == (1, 2)
    assert p.claim("d", "b", p.copies["b"][-1]) is Claimed.PUBLISH
    p.check()
    assert (p.sem.status().parked_count, p.sem.status().handed_over_count) == (0, 3)
    place = p.attempt("b", handover=first)
    assert isinstance(place, Place), "its earlier copy arrives, in d's place"
    assert place.position == 3
    p.check()


def test_a_handed_over_waiters_message_takes_the_turn(publishing: MakePair) -> None:
    """c's message at the head, for b's handover: c takes b's token, and c's own
    handover is void from then on."""
    p = publishing(1)
    parked_behind_a_holder(p, "b", "c")
    p.release("a")
    b_token, c_token = p.copies["b"][-1], p.copies["c"][-1]
    assert p.claim("c", "b", b_token) is Claimed.PUBLISH
    p.check()
    assert p.claim("b", "c", c_token) is Claimed.VOID
    assert isinstance(p.attempt("c", handover=b_token), Permit), "c took b's place too"
    p.check()
    assert p.attempt("c", handover=c_token) is None, "any other copy of c is stale now"
    p.check()


def test_a_copy_that_arrived_or_was_served_is_stale(publishing: MakePair) -> None:
    p = publishing(2)
    p.attempt("a")
    p.attempt("z")
    for waiter in "bcd":
        p.park(waiter, f"message of {waiter}")
    p.release("a")
    b_token, c_token = p.copies["b"][-1], p.copies["c"][-1]
    assert isinstance(p.attempt("b", handover=b_token), Permit), "b arrived: d"
    assert isinstance(p.attempt("c"), Place), "c asks in person"
    p.release("z")
    assert isinstance(p.attempt("c"), Permit), "c served in person: x"
    p.check()
    for taken, token in (("b", b_token), ("c", c_token)):
        assert p.claim(taken, taken, token) is Claimed.STALE
        assert p.claim(taken, "d", p.copies["d"][-1]) is Claimed.STALE, "X before H"
    p.check()


def test_a_message_of_a_task_not_parked_is_absent(publishing: MakePair) -> None:
    p = publishing(1)
    parked_behind_a_holder(p, "b")
    p.attempt("c")  # in line, asking in person: no record
    p.release("a")
    token = p.copies["b"][-1]
    assert p.claim("nobody", "b", token) is Claimed.ABSENT
    assert p.claim("c", "b", token) is Claimed.ABSENT
    assert p.claim("c", "gone", token) is Claimed.ABSENT, "X is answered before H"
    p.check()
    assert p.claim("b", "b", token) is Claimed.PUBLISH, "b's handover is untouched"


def test_a_message_of_a_waiter_in_place_is_absent(publishing: MakePair) -> None:
    p = publishing(1, listen=True)
    try:
        parked_behind_a_holder(p, "b")
        assert isinstance(p.attempt("w", in_place=True), Place)
        p.release("a")
        assert p.claim("w", "b", p.copies["b"][-1]) is Claimed.ABSENT
        p.check()
    finally:
        p.close()


def test_a_handover_that_is_not_the_latest_is_void(publishing: MakePair) -> None:
    p = publishing(1, handover_deadline=DEADLINE)
    parked_behind_a_holder(p, "b", "c", "d")
    p.release("a")
    first = p.copies["b"][-1]
    assert p.claim("d", "b", p.copies["c"][-1]) is Claimed.VOID, "c's token is not b's"
    assert p.claim("d", "d", first) is Claimed.VOID, "d is parked, not handed over"
    time.sleep(DEADLINE + 0.2)
    p.dispatch()
    assert p.claim("d", "b", first) is Claimed.VOID, "b was handed over again"
    latest = p.copies["b"][-1]
    assert isinstance(p.attempt("b", handover=latest), Permit)
    assert p.claim("d", "b", latest) is Claimed.VOID, "b arrived"
    p.dispatch(("c",))
    assert p.claim("d", "c", p.copies["c"][-1]) is Claimed.VOID, "c was dropped"
    p.check()


def test_a_swapped_waiter_is_handed_over_with_the_payload_it_parked(
    publishing: Callable[..., Pair],
) -> None:
    """A place parked at publish carries its ticket in its payload; a claim's swap gives
    the waiter another ticket, not another payload (found by the state machine: the
    driver compared the payload against the waiter's ticket after the swap)."""
    p = publishing(1, shadow=("limit",))
    p.set_draining(True)
    p.take_place_or_park("h1", "message of h1", window=0.0)
    p.take_place_or_park("h0", "message of h0", window=0.0)
    p.set_draining(False)
    p.claim("h0", "h1", p.copies["h1"][-1])
    handed = p.dispatch(())
    assert handed, "the swapped waiter is handed over again, with its own payload"
    p.check()
