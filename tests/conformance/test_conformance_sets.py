"""Several semaphores taken at once: a store's `SemaphoreSet` against the model's
`acquire_all` (`PairSet`): grants, refusals, the refusal's places, and every line's
``status()``. Each scenario also asserts its rule outright."""

from __future__ import annotations

from collections.abc import Callable

from conformance_driver import Pair, PairSet

from celery_semaphore import Permit, Place, Places

MakePair = Callable[..., Pair]


def pair_set(pair: MakePair, *limits: int) -> PairSet:
    return PairSet([pair(limit) for limit in limits])


def test_a_set_grants_all_or_none(pair: MakePair) -> None:
    s = pair_set(pair, 1, 2)
    a, b = s.pairs
    a.attempt("x")
    refused = s.attempt("y")
    assert isinstance(refused, Places) and refused.refused_by == (0,)
    assert refused.places[0].ticket == refused.ticket and refused.places[1].ticket == 0, (
        "it stands in line where it was refused, and leaves the line that would admit it"
    )
    s.check()
    assert b.sem.status().holder_count == 0, "nothing is taken on B"
    a.release("x")
    granted = s.attempt("y", refused.ticket)
    assert not isinstance(granted, Places) and len(granted) == 2
    s.check()


def test_one_ticket_keeps_the_same_order_in_every_line(pair: MakePair) -> None:
    s = pair_set(pair, 1, 1)
    a, b = s.pairs
    a.attempt("x")
    b.attempt("z")
    first = s.attempt("p")
    second = s.attempt("q")
    assert isinstance(first, Places) and isinstance(second, Places)
    assert first.refused_by == second.refused_by == (0, 1) and first.ticket < second.ticket
    s.check()
    for sem in (a.sem, b.sem):
        assert [w.holder for w in sem.status().waiters] == ["p", "q"]
    a.release("x")
    b.release("z")
    assert isinstance(s.attempt("q", second.ticket), Places), "p is first in both lines"
    assert not isinstance(s.attempt("p", first.ticket), Places)
    s.check()


def test_held_back_it_keeps_its_place_where_it_would_be_admitted(pair: MakePair) -> None:
    s = pair_set(pair, 1, 2)
    a, b = s.pairs
    a.attempt("x")
    held = s.attempt("y", hold_back=30.0)
    assert isinstance(held, Places) and held.places[1].ticket == held.ticket
    b.attempt("w")
    assert isinstance(b.attempt("v"), Place), "y stands ahead in B: one permit is left for it"
    s.check()
    assert isinstance(s.attempt("y", held.ticket), Places)  # no hold back: it leaves B
    assert isinstance(b.attempt("v"), Permit)
    s.check()


def test_a_permit_held_on_one_is_kept_and_weights_count(pair: MakePair) -> None:
    s = pair_set(pair, 2, 3)
    a, b = s.pairs
    b.attempt("y", weight=2)  # a redelivered job holds B already
    a.attempt("x", weight=2)
    refused = s.attempt("y", hold_back=30.0, weights=[1, 2])
    assert isinstance(refused, Places) and refused.refused_by == (0,)
    assert refused.places[1].ticket == 0, "it holds B: it stands in no line there"
    s.check()
    a.release("x")
    assert not isinstance(s.attempt("y", refused.ticket, weights=[1, 2]), Places)
    s.check()
    assert [h.permits for h in b.sem.status().holders] == [2]


def test_a_fair_key_places_the_one_ticket_at_its_turn(pair: MakePair) -> None:
    s = pair_set(pair, 1, 1)
    a = s.pairs[0]
    a.attempt("x", fair_key="k1")
    a.attempt("w1", fair_key="k1")
    a.attempt("w2", fair_key="k1")
    refused = s.attempt("y", fair_keys=["k2", None])
    assert isinstance(refused, Places) and refused.refused_by == (0,)
    s.check()
    assert [w.holder for w in a.sem.status().waiters] == ["w1", "y", "w2"], "keys alternate"


def test_its_one_ticket_is_the_earliest_of_its_places(pair: MakePair) -> None:
    s = pair_set(pair, 1, 1)
    a, b = s.pairs
    a.attempt("x")
    b.attempt("u")
    early = a.attempt("y")  # a place in A first
    b.attempt("z")
    b.attempt("y")  # then in B, behind z
    refused = s.attempt("y")
    assert isinstance(early, Place) and isinstance(refused, Places)
    assert refused.ticket == early.ticket, "the earlier of its places"
    assert [w.holder for w in b.sem.status().waiters] == ["y", "z"], "it moves ahead of z"
    s.check()
